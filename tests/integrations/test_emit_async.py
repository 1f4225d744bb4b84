"""Off-policy and async picks in each trainer's keys (integrations/emit_async.py), in the system Python:
the values, the constraints each trainer enforces, the refusals, and reading the pick from a
recommendation. The trainers themselves judge these configs in test_packages_async.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from batchtune.errors import InputError
from batchtune.integrations.emit import emit, recommendation_input
from batchtune.integrations.emit_async import VERL_FULLY_ASYNC, VERL_ONE_STEP_OFF
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_files import trainer_file


def rec(**kw) -> RecommendationInput:
    base = {"prompts": 64, "group_size": 8, "lr": 1e-6}
    return RecommendationInput(**{**base, **kw})


SPLIT = {"mode": "async", "rollout_gpus": 4}


def test_sync_pick_has_no_async_keys():
    """On-policy, one epoch, colocated: the text is what it always was (no async keys or notes)."""
    for trainer in ("verl", "trl", "openrlhf"):
        out = emit(trainer, rec(mini_batches=2), 8)
        assert not any("async" in k or "v1" in k or "staleness" in k for k in out.values), trainer
        assert "not checked" not in out.text


def test_verl_v1_separate_async():
    out = emit("verl", rec(mini_batches=2, staleness=2, **SPLIT), 8)
    v = out.values
    assert out.text.startswith("python3 -m verl.trainer.main_ppo")
    assert v["trainer.v1.trainer_mode"] == "separate_async"
    assert v["trainer.v1.separate_async.num_warmup_batches"] == 2
    assert v["trainer.v1.sampler.max_off_policy_threshold"] == 3
    # verl asserts train_batch_size == parameter_sync_step * ppo_mini_batch_size
    mini = v["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert v["data.train_batch_size"] == v["trainer.v1.separate_async.parameter_sync_step"] * mini
    assert v["actor_rollout_ref.hybrid_engine"] is False
    assert v["actor_rollout_ref.rollout.checkpoint_engine.backend"] != "naive"
    train = v["trainer.n_gpus_per_node"] * v["trainer.nnodes"]
    roll = v["actor_rollout_ref.rollout.n_gpus_per_node"] * v["actor_rollout_ref.rollout.nnodes"]
    assert (train, roll) == (4, 4)
    # the per-GPU batch is split over the 4 trainer GPUs, not 8
    assert v["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 32 * 8 // 4
    assert v["algorithm.rollout_correction.bypass_mode"] is True
    assert "fully_async" in out.text and "not checked" in out.text


def test_verl_colocated_stale_pick_is_colocate_async():
    v = emit("verl", rec(staleness=1, epochs=2), 8).values
    assert v["trainer.v1.trainer_mode"] == "colocate_async"
    assert v["trainer.v1.colocate_async.num_warmup_batches"] == 1
    assert v["actor_rollout_ref.actor.ppo_epochs"] == 2
    assert "actor_rollout_ref.hybrid_engine" not in v and v["trainer.n_gpus_per_node"] == 8


@pytest.mark.parametrize(
    ("k", "sync_every", "mb", "epochs"), [(0, 1, 1, 1), (2, 1, 2, 1), (2, 3, 2, 2), (4, 2, 4, 1)]
)
def test_verl_fully_async_sync_interval(k, sync_every, mb, epochs):
    """One sync interval is sync_every batches: trigger x require x mini = sync_every x P prompts, and
    staleness_threshold is the share of an interval generated ahead of it."""
    r = rec(staleness=k, sync_every=sync_every, mini_batches=mb, epochs=epochs, **SPLIT)
    out = emit("verl", r, 8, async_trainer=VERL_FULLY_ASYNC)
    v = out.values
    assert out.text.startswith("python3 -m verl.experimental.fully_async_policy.fully_async_main")
    assert v["data.train_batch_size"] == 0 and v["data.gen_batch_size"] == 1  # fully_async asserts both
    mini = v["actor_rollout_ref.actor.ppo_mini_batch_size"]
    interval = v["async_training.trigger_parameter_sync_step"] * v["async_training.require_batches"] * mini
    assert interval == sync_every * 64
    assert v["async_training.staleness_threshold"] == pytest.approx((k + 1 - sync_every) / sync_every)
    if epochs > 1:  # whole batch per local update: ppo_epochs pass over all its mini-batches
        assert v["async_training.require_batches"] == mb
    assert v["rollout.n_gpus_per_node"] * v["rollout.nnodes"] == 4


def test_verl_one_step_off_is_exactly_k1():
    v = emit("verl", rec(staleness=1, **SPLIT), 8, async_trainer=VERL_ONE_STEP_OFF).values
    assert v["rollout.n_gpus_per_node"] == 4 and v["data.train_batch_size"] == 64
    with pytest.raises(InputError, match="exactly staleness 1"):
        emit("verl", rec(staleness=2, **SPLIT), 8, async_trainer=VERL_ONE_STEP_OFF)
    with pytest.raises(InputError, match="needs mode='async'"):
        emit("verl", rec(staleness=2), 8, async_trainer=VERL_FULLY_ASYNC)


def test_trl_epochs_and_async_grpo():
    v = emit("trl", rec(mini_batches=2, epochs=3), 8).values
    assert v["num_iterations"] == 3 and v["generation_batch_size"] == 512
    out = emit("trl", rec(mini_batches=2, staleness=2, sync_every=2, in_flight_cap=1, **SPLIT), 8)
    v = out.values
    assert "AsyncGRPOConfig(" in out.text
    assert "generation_batch_size" not in v and "num_iterations" not in v  # AsyncGRPOConfig has neither
    assert v["max_staleness"] == 1  # versions: one per 2 steps
    assert v["weight_sync_steps"] == 2 * 2  # optimiser steps per sync: mini-batches x sync_every
    assert v["queue_maxsize"] == 1 * 512
    assert v["per_device_train_batch_size"] * v["gradient_accumulation_steps"] * 4 == 256  # 4 trainer GPUs
    with pytest.raises(InputError, match="uses each completion once"):
        emit("trl", rec(staleness=1, epochs=2), 8)
    assert "AsyncGRPOConfig(**yaml" in trainer_file("trl", out.values, out.text)


def test_openrlhf_async_flags():
    out = emit("openrlhf", rec(mini_batches=2, epochs=2, staleness=2, partial_rollout=True, **SPLIT), 8)
    v = out.values
    assert v["--train.async_enable"] is True and v["--train.partial_rollout_enable"] is True
    assert v["--train.async_queue_size"] == 2 and v["--train.max_epochs"] == 2
    assert v["--vllm.num_engines"] == 4 and v["--actor.num_gpus_per_node"] == 4
    assert v["--train.batch_size"] == 256
    for text in (out.text, trainer_file("openrlhf", v, out.text)):  # store_true flags take no value
        assert "    --train.async_enable \\\n" in text and "--train.async_enable True" not in text
    # partial rollout needs async (OpenRLHF asserts it): never emitted for an on-policy pick
    assert "--train.partial_rollout_enable" not in emit("openrlhf", rec(partial_rollout=True), 8).values
    assert emit("openrlhf", rec(staleness=3, in_flight_cap=1), 8).values["--train.async_queue_size"] == 1
    with pytest.raises(InputError, match="0.10.2 only"):
        emit("openrlhf", rec(staleness=1), 8, legacy_flags=True)


@pytest.mark.parametrize(
    ("kw", "gpus", "match"),
    [
        ({"staleness": 0, "sync_every": 2}, 8, "needs staleness >= 1"),
        # the colocated form is the API's: --set algorithm.mode=sync keeps the pick async
        ({"mode": "async"}, 1, r"give --gpus 2 or more \(by API, RecommendationInput\(mode='sync'\)"),
        ({"mode": "async", "rollout_gpus": 8}, 8, "must leave GPUs to train on"),
        ({"rollout_gpus": 2}, 8, "needs mode='async'"),
        ({"mode": "later"}, 8, "mode must be"),
        ({"epochs": 0}, 8, "epochs and sync_every"),
    ],
)
def test_bad_async_settings_are_refused(kw, gpus, match):
    for trainer in ("verl", "trl", "openrlhf"):
        with pytest.raises(InputError, match=match):
            emit(trainer, rec(**kw), gpus)


def test_split_without_rollout_gpus_is_half_and_said():
    out = emit("verl", rec(staleness=1, mode="async"), 8)
    assert out.values["actor_rollout_ref.rollout.n_gpus_per_node"] == 4
    assert "names no rollout:train split" in out.text


def _recommendation(label: str, **winner):
    w = SimpleNamespace(label=label, prompts=64, group_size=8, lr=1e-6, critic_lr=None, **winner)
    return SimpleNamespace(winner=w, winner_throughput=SimpleNamespace(generation_concurrency=None))


def test_pick_read_from_the_async_choice_or_the_label():
    """k, u, mini-batches, mode, sync_every, cap and split from the async ranking's pick when there is
    one; else k and u from the -k{k}u{u} label (without a recipe u counts epochs of one mini-batch,
    its default); a split ranked on other GPUs is scaled to --gpus, and the text says so."""
    r = recommendation_input(_recommendation("P64xG8-k2u4"))  # type: ignore[arg-type]
    assert (r.staleness, r.mini_batches, r.epochs, r.mode) == (2, 1, 4, "sync")
    assert recommendation_input(_recommendation("P64xG8")).staleness == 0  # type: ignore[arg-type]
    rec2 = _recommendation("P64xG8-k1u2")
    rec2.async_choice = SimpleNamespace(
        mode="async", staleness=1, updates_per_batch=4, mini_batches=2, sync_every=2, in_flight_cap=3,
        rollout_gpus=1, train_gpus=1, total_gpus=2,
    )  # fmt: skip
    r = recommendation_input(rec2, None, 2)  # type: ignore[arg-type]
    assert (r.staleness, r.mini_batches, r.epochs, r.mode, r.sync_every) == (1, 2, 2, "async", 2)
    assert (r.rollout_gpus, r.in_flight_cap, r.split_from) == (1, 3, "")
    r8 = recommendation_input(rec2, None, 8)  # type: ignore[arg-type]
    assert r8.rollout_gpus == 4 and "scaled to 4:4" in r8.split_from
    assert "scaled to 4:4" in emit("verl", r8, 8).text


def test_a_shared_pick_is_no_one_gpu_rollout_and_a_real_split_is_kept():
    """A pick ranked on one shared device (rollout_gpus None, split "shared") names no split: each
    emitter falls back to half and says so, never a 1-GPU rollout; a modelled 6:2 of 8 is emitted 6:2."""
    from batchtune.analysis.decide.async_rank import AsyncPick
    from batchtune.report.joint import pick_to_dict

    def pick(rollout, train, total):
        return AsyncPick("P64xG8-k1u1", "async", 1, 1, 1, 1, 0, rollout, train, total)

    shared, split = pick(None, None, 1), pick(6, 2, 8)
    assert (pick_to_dict(shared)["split"], pick_to_dict(split)["split"]) == ("shared", "6:2")
    for choice, want, said in ((shared, 4, "names no rollout:train split"), (split, 6, None)):
        r = _recommendation("P64xG8-k1u1")
        r.async_choice = choice
        inp = recommendation_input(r, None, 8)  # type: ignore[arg-type]
        assert (inp.mode, inp.rollout_gpus) == ("async", 0 if choice is shared else 6)
        verl = emit("verl", inp, 8)
        assert verl.values["actor_rollout_ref.rollout.n_gpus_per_node"] == want
        assert emit("openrlhf", inp, 8).values["--vllm.num_engines"] == want
        assert (said in verl.text) if said else "names no rollout:train split" not in verl.text


def _read(tmp_path, trainer: str, text: str, extra: str = ""):
    from batchtune.integrations.trainer_configs import read_trainer_config

    path = tmp_path / f"{trainer}.cfg"
    path.write_text(text + extra)
    return read_trainer_config(path, trainer)


def test_check_reads_the_async_keys_back(tmp_path):
    """`check` finds k, u and the mode batchtune wrote, for each trainer, printed and as a file."""
    from batchtune.integrations.trainer_configs_async import in_rollout_batches
    from tests.integrations.async_cases import ASYNC_WINNERS

    seen = 0
    for _, r, gpus, opts in ASYNC_WINNERS:
        for trainer, variant in (
            ("verl", "v1"),
            ("verl", VERL_FULLY_ASYNC),
            ("openrlhf", None),
            ("trl", None),
        ):
            o = {**opts, **({"async_trainer": variant} if variant else {})}
            if trainer == "trl":
                o.pop("gpus_per_node", None)
            try:
                e = emit(trainer, r, gpus, **o)
            except InputError:
                continue
            texts = [trainer_file(trainer, e.values, e.text)] + ([e.text] if trainer != "trl" else [])
            for text in texts:
                # TRL's file has no num_processes key ((Async)GRPOConfig refuses it): check reads the
                # count from the file's `accelerate launch --num_processes N` comment
                c = _read(tmp_path, trainer, text)
                seen += 1
                if trainer == "trl":  # colocated: each of the --gpus processes generates its share
                    assert c.engines == (1 if r.staleness or r.mode == "async" else gpus), r
                if trainer == "verl" and variant == VERL_FULLY_ASYNC and r.off_policy:
                    # one sync interval is read as the batch: k in intervals, u per interval
                    assert c.prompts == r.sync_every * r.prompts
                    assert c.staleness == pytest.approx((r.staleness + 1 - r.sync_every) / r.sync_every)
                    assert c.updates_per_batch == r.sync_every * r.updates_per_batch
                    # and in the probe's rollout batches (check's reading), the pick's own B, k and u
                    got = in_rollout_batches(c.own_units, r.sync_every)
                    assert got.batch_responses == r.batch_responses
                    assert got.updates_per_batch == r.updates_per_batch
                    assert got.staleness_lo == got.staleness_hi == r.staleness, (r, got)
                elif trainer == "trl" and r.staleness:  # AsyncGRPO: one optimiser step is the batch
                    assert c.staleness * c.prompts == r.staleness * r.prompts  # the lag, in prompts
                    assert c.updates_per_batch == 1
                    # and in the probe's rollout batches (check's reading), the pick's own B, k and u
                    got = in_rollout_batches(c.own_units, r.sync_every)
                    assert (got.batch_responses, got.updates_per_batch) == (r.batch_responses, r.mini_batches)
                    assert got.staleness_lo <= r.staleness <= got.staleness_hi, (r, got)
                    assert got.staleness_lo == got.staleness_hi or r.sync_every > 1
                else:
                    want_k = (
                        min(r.staleness, r.in_flight_cap or r.staleness)
                        if trainer == "openrlhf"
                        else r.staleness
                    )
                    assert (c.prompts, c.staleness, c.updates_per_batch) == (
                        r.prompts,
                        want_k,
                        r.updates_per_batch,
                    )
                if trainer == "verl" and r.off_policy:  # V1 separate_async and fully_async: GPUs apart
                    assert c.mode == r.mode, (trainer, r)
    assert seen >= 30


def test_check_notes_a_config_that_is_not_the_pick():
    from batchtune.integrations.trainer_configs_async import pick_note

    assert pick_note(0.0, 2.0, 0, 0) == ""  # u not recorded by the pick: not compared
    assert pick_note(1.0, 2.0, 1, 2) == ""
    assert "staleness 2 with 1 update(s)" in pick_note(2.0, 1.0, 0, 4)


def _split_pick(label: str, total: int, rollouts: list[int]):
    """A P4xG8 winner whose modelled splits of ``total`` GPUs rank ``rollouts`` in that order."""
    from batchtune.analysis.decide.async_rank import AsyncChoice, AsyncPick, SplitRanking, SplitRow

    def row(g):
        return SplitRow(label, AsyncChoice("async", 32, 1, 1, g, None, 1.0, 1.0, 0, 0, 1.0, 1.0, 1.0), "")

    r = SimpleNamespace(
        winner=SimpleNamespace(label=label, prompts=4, group_size=8, lr=1e-6, critic_lr=None),
        winner_throughput=SimpleNamespace(generation_concurrency=None),
    )
    r.async_choice = AsyncPick(label, "async", 1, 1, 1, 1, 0, rollouts[0], total - rollouts[0], total)
    r.async_decision = SimpleNamespace(splits=SplitRanking(total, tuple(row(g) for g in rollouts), ()))
    return r


def test_a_modelled_split_the_trainer_cannot_take_falls_to_the_next():
    """The split model knows no trainer rules: on 16 GPUs (nodes of 8) it put 12 GPUs on the rollout,
    which verl cannot lay out, and `recommend --emit verl --gpus 16` stopped on "12 rollout GPUs do
    not fill nodes of 8; give a multiple of 8" though 16 is one. The next modelled split that fits
    (8:8) is emitted and said; with none that fits, the error names the splits tried."""
    from batchtune.integrations.emit import emit_for_recommendation

    r = _split_pick("P4xG8-k1u1", 16, [12, 8, 4])
    out = emit_for_recommendation(r, "verl", 16, gpus_per_node=8)  # type: ignore[arg-type]
    assert out.values["actor_rollout_ref.rollout.n_gpus_per_node"] == 8
    assert out.values["trainer.n_gpus_per_node"] == 8
    assert "modelled best split 12:4" in out.text and "fits, 8:8" in out.text
    assert "give a multiple" not in out.text
    assert out.pick is not None and (out.pick.rollout_gpus, out.pick.train_gpus) == (8, 8)  # run_as says it
    assert out.pick.split_note == out.notes[-1]
    assert emit_for_recommendation(_split_pick("P4xG8-k1u1", 16, [8, 12]), "verl", 16).pick is None  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"tried 9:3, 6:6, 3:9\): give another --gpus"):
        emit_for_recommendation(_split_pick("P4xG8-k1u1", 12, [9, 6, 3]), "verl", 12)  # type: ignore[arg-type]


def test_an_error_no_split_can_mend_is_not_blamed_on_the_split():
    """Before, every InputError tried the other splits and ended "...: give another --gpus", which
    cannot mend a pick the trainer refuses at any split (TRL's async trainer takes no epochs > 1)."""
    import dataclasses

    from batchtune.integrations.emit import emit_for_recommendation

    r = _split_pick("P4xG8-k1u2", 8, [4, 2, 6])
    r.async_choice = dataclasses.replace(r.async_choice, updates_per_batch=2)
    with pytest.raises(InputError) as got:
        emit_for_recommendation(r, "trl", 8)  # type: ignore[arg-type]
    assert "give another --gpus" not in str(got.value) and "tried" not in str(got.value)
