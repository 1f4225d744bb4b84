"""The torch RL backend on the built-in tiny Llama (no download): learning, LR, determinism, failures.

All runs share one warm start, computed once per session in a temporary results directory.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from batchtune.analysis.sample.lr import warmup_factor
from batchtune.backends import load
from batchtune.backends.spec import Candidate, OutOfMemory, RunFailed, RunSpec
from batchtune.backends.torch_rl import TorchRLBackend
from batchtune.backends.torch_rl.grpo import group_advantages, minibatch_groups
from batchtune.backends.torch_rl.ppo import gae
from batchtune.backends.torch_rl.rollout import response_mask
from batchtune.backends.torch_rl.tasks import char_reward, make_task
from batchtune.backends.torch_rl.trainer import STAGE_TIMERS
from batchtune.errors import BackendError
from batchtune.recipe.load import load_recipe

# reverse 4 letters from a 50-step warm start: held-out reward ~0.73, RL climbs within ~2k responses
BASE = [
    "model.pretrain_steps=50",
    'task.name="reverse"',
    "task.difficulty=4",
    "task.eval_size=64",
    "hardware.threads=1",
    "generation.max_new_tokens=6",
    'hardware.device="cpu"',
]


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """The backend sets torch's thread count from hardware.threads; leave the process as found."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def results(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("results")


def make_spec(results: Path, *overrides: str, prompts=2, group=8, seed=0, lr=3e-4, critic_lr=None):
    recipe = load_recipe(None, [*BASE, *overrides])
    cand = Candidate(f"P{prompts}xG{group}", prompts, group, lr, "sqrt", critic_lr=critic_lr)
    rid = f"{cand.label}-s{seed}"
    return RunSpec(rid, cand, seed, recipe, results / "runs" / rid, lr, prompts * group)


def run(spec: RunSpec) -> list:
    return list(TorchRLBackend().train(spec))


def comparable(records) -> list:
    """Records without wall-clock and CPU timings (which differ run to run)."""
    return [
        dataclasses.replace(
            r, gen_s=0.0, train_s=0.0, other_s=0.0,
            metrics={k: v for k, v in r.metrics.items() if k not in STAGE_TIMERS},
        )  # fmt: skip
        for r in records
    ]


def test_registered_as_torch():
    assert load("training", "torch") is TorchRLBackend


@pytest.mark.slow  # 13 s at load 4; test_offpolicy.py's golden curves pin the trainer by default
def test_grpo_reward_rises(results):
    spec = make_spec(results, "budget.max_samples=4096", "task.eval_every_samples=1024", prompts=8, lr=6e-4)
    recs = run(spec)
    train = [r.metrics["reward"] for r in recs[1:]]
    first, last = sum(train[:8]) / 8, sum(train[-8:]) / 8  # measured: 0.68 -> 0.87
    assert last > first + 0.1, (first, last)
    evals = [r.metrics["eval_reward"] for r in recs if "eval_reward" in r.metrics]
    assert evals[-1] > evals[0] + 0.05, evals  # measured: 0.88 -> 1.00
    assert recs[-1].samples == 4096 and recs[-1].step == 64


def test_records_count_samples_tokens_and_eval_schedule(results):
    spec = make_spec(results, "budget.max_samples=96", "task.eval_every_samples=32", prompts=2)
    recs = run(spec)
    assert [r.step for r in recs] == list(range(7))
    assert recs[0].samples == 0 and recs[0].tokens == 0 and recs[0].lr == 0.0
    assert set(recs[0].metrics) == {"eval_reward"} and recs[0].grad_norm is None
    assert [r.samples for r in recs] == [0, 16, 32, 48, 64, 80, 96]
    # evaluated at 0, then every 32 responses and at the end; never carried forward
    assert [("eval_reward" in r.metrics) for r in recs] == [True, False, True, False, True, False, True]
    tokens = [r.tokens for r in recs]
    assert all(b > a for a, b in zip(tokens, tokens[1:], strict=False))
    for r in recs[1:]:
        assert {"reward", "loss", "response_len"} <= set(r.metrics)
        assert 0.0 <= r.metrics["reward"] <= 1.0
        assert r.grad_norm is not None and r.grad_norm > 0 and r.critic_grad_norm is None
        assert (r.prompts, r.group_size, r.seed) == (2, 8, 0)
        assert r.gen_s > 0 and r.train_s > 0
        # stage times under the async run's names: CPU within wall, the step's parts within its wall
        timers = {k: r.metrics[k] for k in STAGE_TIMERS}
        assert all(math.isfinite(v) and v >= 0 for v in timers.values()), timers
        assert 0 < timers["gen_cpu_s"] <= r.gen_s * 1.05 + 1e-3 and timers["train_cpu_s"] > 0
        assert r.gen_s + r.train_s + r.other_s <= timers["wall_s"] * 1.001 + 1e-4


def test_lr_is_the_candidates_with_warmup_in_samples(results, monkeypatch):
    from batchtune.backends.torch_rl import grpo

    used: list[float] = []
    real_set_lr = grpo.set_lr
    monkeypatch.setattr(grpo, "set_lr", lambda opt, lr: (used.append(lr), real_set_lr(opt, lr)))
    spec = make_spec(results, "budget.max_samples=96", "optimizer.warmup_samples=64", prompts=2, lr=2.5e-4)
    recs = run(spec)
    expected = [2.5e-4 * warmup_factor(16 * k, 64) for k in range(1, 7)]
    assert [r.lr for r in recs[1:]] == pytest.approx(expected)
    assert expected[0] == pytest.approx(2.5e-4 / 4) and expected[-1] == pytest.approx(2.5e-4)
    assert used == pytest.approx(expected)  # what the optimiser was actually given


def test_same_seed_same_records_other_seed_differs(results):
    args = ("budget.max_samples=64", "task.eval_every_samples=32")
    a = comparable(run(make_spec(results, *args, seed=3)))
    b = comparable(run(make_spec(results, *args, seed=3)))
    c = comparable(run(make_spec(results, *args, seed=4)))
    assert a == b
    assert [r.metrics for r in a[1:]] != [r.metrics for r in c[1:]]
    # every seed starts from the same (cached) warm start
    assert a[0].metrics == c[0].metrics
    assert len(list((results / "cache").glob("warmstart-reverse-*.pt"))) == 1


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_checkpoint_resumes_exactly_and_other_seeds_branch_independently(results, tmp_path, algorithm):
    """Branched probes: the trunk saves at 32 samples; the same seed resumed from there repeats the
    trunk's later steps bit for bit (weights, optimiser moments, prompts, sampling, critic); another
    seed starts from the same weights but draws its own prompts; a bigger batch keeps its own LR."""
    args = (f"algorithm.name={algorithm}", "budget.max_samples=64", "task.eval_every_samples=32",
            "algorithm.kl_coef=0.05")  # fmt: skip
    trunk_spec = dataclasses.replace(
        make_spec(results, *args, seed=3), save_at_samples=(32,), checkpoint_dir=tmp_path / "ckpts"
    )
    trunk = comparable(run(trunk_spec))
    ckpt = tmp_path / "ckpts" / "ckpt-32"
    assert (ckpt / "state.pt").is_file() and not list(ckpt.glob("*.tmp"))
    resumed = comparable(run(dataclasses.replace(make_spec(results, *args, seed=3), resume_from=ckpt)))
    assert [r.samples for r in resumed] == [48, 64]  # no step-0 evaluation: the branch starts mid-run
    assert [(r.step, r.metrics, r.grad_norm, r.critic_grad_norm) for r in resumed] == [
        (r.step, r.metrics, r.grad_norm, r.critic_grad_norm) for r in trunk[-2:]
    ]
    other = comparable(run(dataclasses.replace(make_spec(results, *args, seed=4), resume_from=ckpt)))
    assert [r.samples for r in other] == [48, 64]
    assert [r.metrics for r in other] != [r.metrics for r in resumed]
    again = comparable(run(dataclasses.replace(make_spec(results, *args, seed=4), resume_from=ckpt)))
    assert again == other  # a branch is deterministic per (checkpoint, seed)
    wide = run(dataclasses.replace(make_spec(results, *args, prompts=4, lr=5e-4, seed=3), resume_from=ckpt))
    assert [r.samples for r in wide] == [64] and wide[0].lr == pytest.approx(5e-4)


def test_a_stage_ending_off_the_eval_grid_resumes_onto_the_same_evaluations(results, tmp_path):
    """A schedule stage that ends at 48 samples evaluates there (its end); the next stage, resumed from
    its checkpoint, must still evaluate at 64 and 96 like the uninterrupted run, with equal values."""
    args = ("task.eval_every_samples=32", "budget.max_samples=96")
    fixed = comparable(run(make_spec(results, *args, seed=5)))
    stage = dataclasses.replace(
        make_spec(results, "task.eval_every_samples=32", "budget.max_samples=48", seed=5),
        save_at_samples=(48,), checkpoint_dir=tmp_path / "ckpts",
    )  # fmt: skip
    first = run(stage)
    assert "eval_reward" in first[-1].metrics  # the stage's own end
    ckpt = tmp_path / "ckpts" / "ckpt-48"
    resumed = dataclasses.replace(make_spec(results, *args, seed=5), resume_from=ckpt)
    rest = comparable(run(resumed))
    evals = {r.samples: r.metrics["eval_reward"] for r in rest if "eval_reward" in r.metrics}
    want = {r.samples: r.metrics["eval_reward"] for r in fixed if "eval_reward" in r.metrics}
    want = {k: v for k, v in want.items() if k > 48}
    assert evals == want and sorted(evals) == [64, 96]
    assert [r.metrics["reward"] for r in rest] == [r.metrics["reward"] for r in fixed if r.samples > 48]


def test_a_missing_checkpoint_fails_the_run_with_its_path(results, tmp_path):
    spec = dataclasses.replace(make_spec(results, "budget.max_samples=32"), resume_from=tmp_path / "nope")
    with pytest.raises(RunFailed, match="cannot read the checkpoint .*nope"):
        run(spec)


def test_absurd_lr_diverges(results):
    spec = make_spec(results, "budget.max_samples=256", prompts=2, lr=1e30)
    with pytest.raises(RunFailed) as info:
        run(spec)
    assert info.value.status == "diverged"


def test_nan_loss_diverges(results, monkeypatch):
    from batchtune.backends.torch_rl import grpo

    monkeypatch.setattr(grpo, "group_advantages", lambda r, g: torch.full_like(r, math.nan))
    with pytest.raises(RunFailed, match="policy loss") as info:
        run(make_spec(results, "budget.max_samples=64"))
    assert info.value.status == "diverged"


def test_cuda_oom_becomes_out_of_memory(results, monkeypatch):
    from batchtune.backends.torch_rl import trainer

    def boom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer, "generate", boom)
    with pytest.raises(OutOfMemory) as info:
        run(make_spec(results, "budget.max_samples=64"))
    assert info.value.status == "oom" and "16 responses per step" in info.value.message


def test_grpo_kl_to_the_reference(results):
    recs = run(make_spec(results, "budget.max_samples=64", "algorithm.kl_coef=0.05", prompts=4))
    assert recs[1].metrics["kl"] == pytest.approx(0.0, abs=1e-9)  # first step: policy == reference
    assert recs[-1].metrics["kl"] > 0.0


def test_micro_batches_change_memory_not_maths(results):
    args = ("budget.max_samples=64", "algorithm.kl_coef=0.05", "algorithm.mini_batches=2")
    whole = comparable(run(make_spec(results, *args, prompts=4)))
    micro = comparable(run(make_spec(results, *args, "algorithm.micro_batch_responses=8", prompts=4)))
    assert [r.samples for r in micro] == [r.samples for r in whole]
    for a, b in zip(whole[1:], micro[1:], strict=True):
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        assert b.metrics["loss"] == pytest.approx(a.metrics["loss"], rel=1e-4, abs=1e-6)


def test_ppo_logs_both_grad_norms_and_a_separate_critic_lr(results):
    args = ("algorithm.name=ppo", "budget.max_samples=64", "optimizer.warmup_samples=32")
    recs = run(make_spec(results, *args, lr=2e-4, critic_lr=1e-3))
    for r in recs[1:]:
        assert r.grad_norm is not None and r.grad_norm > 0
        assert r.critic_grad_norm is not None and r.critic_grad_norm > 0
        factor = warmup_factor(r.samples, 32)
        assert r.lr == pytest.approx(2e-4 * factor)
        assert r.metrics["critic_lr"] == pytest.approx(1e-3 * factor)
        assert "value_loss" in r.metrics
    # the critic LR moves only the critic: same first actor step, different later critic losses
    other = run(make_spec(results, *args, lr=2e-4, critic_lr=1e-5))
    assert other[1].grad_norm == pytest.approx(recs[1].grad_norm)
    assert other[1].metrics["value_loss"] == pytest.approx(recs[1].metrics["value_loss"])
    assert other[-1].metrics["value_loss"] != pytest.approx(recs[-1].metrics["value_loss"])


def test_jsonl_task_with_a_user_reward(results, tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def starts_right(prompt, response, answer):\n    return float(response[:1] == answer[:1])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": f"{a}{b}{c}=", "answer": f"{c}{b}{a}"} for a in "abcd" for b in "abcd" for c in "ab"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = make_spec(
        results, 'task.name="jsonl"', f'task.prompts_file="{prompts}"',
        'task.reward="my_rewards:starts_right"', "task.eval_size=8", "budget.max_samples=32",
    )  # fmt: skip
    recs = run(spec)
    assert len(recs) == 3
    assert all(
        r.metrics["eval_reward"] in {k / 8 for k in range(9)} for r in recs if "eval_reward" in r.metrics
    )


def _save_tiny_gpt2(path: Path) -> None:
    """A 1-layer GPT-2 (learned absolute positions, dropout 0.1) and a character tokenizer, saved."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = ["<pad>", "<bos>", "<eos>", *"abcdefghij="]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(vocab), n_embd=32, n_layer=1, n_head=2, n_positions=32,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_saved_pretrained_model_runs_without_warm_start(results, tmp_path, algorithm):
    _save_tiny_gpt2(tmp_path / "gpt2")
    before = set((results / "cache").glob("*.pt")) if (results / "cache").exists() else set()
    spec = make_spec(
        results, f'model.name="{tmp_path / "gpt2"}"', f'algorithm.name="{algorithm}"',
        "algorithm.kl_coef=0.1", "budget.max_samples=32", "task.eval_size=8", critic_lr=1e-3,
    )  # fmt: skip
    recs = run(spec)
    assert [r.samples for r in recs] == [0, 16, 32]
    assert all(math.isfinite(r.grad_norm) for r in recs[1:])
    # dropout is off: at the first step the policy equals the reference and rho = 1 exactly
    assert recs[1].metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    assert recs[1].metrics["clip_frac"] == 0.0
    assert (algorithm == "ppo") == (recs[1].critic_grad_norm is not None)
    after = set((results / "cache").glob("*.pt")) if (results / "cache").exists() else set()
    assert after == before  # no warm start for a pretrained model


@pytest.mark.parametrize(
    ("reward", "match"),
    [
        ("no_colon", "module:function"),
        ("no_such_module_xyz:f", "cannot import"),
        ("batchtune.codec:nope", "no function"),
    ],
)
def test_jsonl_bad_reward_is_a_clear_error(results, tmp_path, reward, match):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{c}="}) + "\n" for c in "abcdefgh"))
    spec = make_spec(
        results, 'task.name="jsonl"', f'task.prompts_file="{prompts}"', f'task.reward="{reward}"',
        "task.eval_size=2",
    )  # fmt: skip
    with pytest.raises(BackendError, match=match):
        run(spec)


def test_tasks_are_deterministic_and_disjoint():
    for name, difficulty in [("arithmetic", 2), ("copy", 4), ("sort", 4), ("reverse", 4)]:
        cfg = load_recipe(None, [f'task.name="{name}"', f"task.difficulty={difficulty}"]).task
        a, b = make_task(cfg), make_task(cfg)
        assert a.train == b.train and a.eval == b.eval
        assert len(a.eval) == cfg.eval_size and len(a.train) == cfg.train_size
        assert not {e.prompt for e in a.train} & {e.prompt for e in a.eval}
        assert all(a.reward(e, e.answer) == 1.0 for e in a.eval[:20])
    first = make_task(load_recipe(None, ['task.name="reverse"', "task.difficulty=4"]).task).train[0]
    assert first.answer == first.prompt[:-1][::-1]


def test_char_reward():
    assert char_reward("", "dcba", "dcba") == 1.0
    assert char_reward("", " dcba ", "dcba") == 1.0
    assert char_reward("", "dcbx", "dcba") == 0.75
    assert char_reward("", "dcbaa", "dcba") == 0.8
    assert char_reward("", "", "dcba") == 0.0


def test_group_advantages_and_minibatches_by_whole_groups():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    adv = group_advantages(r, 4)
    assert adv[:4].sum() == pytest.approx(0.0, abs=1e-6) and adv[0] > 0 > adv[1]
    assert torch.all(adv[4:] == 0)  # no variance in the group: no signal
    parts = minibatch_groups(12, 4, 2)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11]]


def test_response_mask_keeps_up_to_first_eos():
    resp = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 2, 9, 0], [5, 6, 7, 8, 9]])
    assert response_mask(resp, 2).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_gae_matches_discounted_returns_when_values_are_zero():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, torch.zeros_like(rewards), mask, gamma=0.9, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.81, 0.9, 1.0, 0.0])
    assert torch.equal(adv, ret)
    # lam = 0: one-step TD errors
    values = torch.tensor([[0.5, 0.5, 0.5, 7.0]])
    adv0, _ = gae(rewards, values, mask, gamma=1.0, lam=0.0)
    assert adv0[0].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_cuda_bf16_steps(results, algorithm):
    spec = make_spec(
        results, 'hardware.device="cuda"', 'model.dtype="bfloat16"', f'algorithm.name="{algorithm}"',
        "algorithm.kl_coef=0.01", "budget.max_samples=64", prompts=2, critic_lr=1e-3,
    )  # fmt: skip
    recs = run(spec)
    assert len(recs) == 5
    assert all(math.isfinite(r.grad_norm) and r.gen_s > 0 for r in recs[1:])
    again = run(spec)
    # the same warm start: greedy held-out reward at step 0 agrees up to GPU kernel noise
    assert again[0].metrics["eval_reward"] == pytest.approx(recs[0].metrics["eval_reward"], abs=0.02)


@pytest.mark.slow
def test_default_probe_finds_the_critical_batch_inside_the_range(tmp_path):
    """The shipped default: the largest batch deviates and the joint crossing is inside the range.

    Only what held on three seed sets is asserted (docs/benchmarks.md, "Reproducible default";
    versions in constraints/tested-versions.txt). Measured on 2 shared CPU cores, seeds 0-2 / 3-5 /
    6-8: critical batch 32 / 32 / 32 by the joint fit, crossing 36 [30, 50] / 51 [42, 66] /
    37 [32, 44], while the verdict walk alone said 16 / 32 / 32 and per-seed R differs from the
    figures of docs/trainer.md (another machine). So: 256 deviates, the bracket closes at or below
    256, and the crossing lies strictly between the smallest and the largest batch.
    """
    from batchtune.measure.probe import run_probe

    root = Path(__file__).resolve().parents[2]
    result = run_probe(
        load_recipe(root / "recipes" / "tiny-grpo.toml").with_results_dir(tmp_path / "results")
    )
    critical = result.efficiency.critical
    assert critical is not None and critical.batch is not None, critical
    assert [v.status for v in critical.verdicts][-1] == "deviates", critical.reason
    assert critical.upper is not None and critical.upper <= 256, critical.reason
    assert critical.crossing is not None and 16 < critical.crossing < 256, critical.reason
