"""TensorBoard event files written with torch.utils.tensorboard.SummaryWriter, the way OpenRLHF's
TensorboardLogger writes them: train/<key> and eval/<key> scalars against the rollout step, in
<tensorboard_dir>/<run name>/."""

from __future__ import annotations

import pytest

from batchtune.errors import InputError
from batchtune.integrations.common import RunInfo
from batchtune.integrations.readers import read_log

pytest.importorskip("tensorboard")


def write_run(folder, rewards, lr=5e-7, timing=False):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(log_dir=str(folder))
    for step, reward in enumerate(rewards, start=1):
        w.add_scalar("train/reward", reward, step, walltime=100.0 + 10.0 * step)
        w.add_scalar("train/policy_loss", -reward, step, walltime=100.0 + 10.0 * step)
        w.add_scalar("train/actor_lr", lr, step, walltime=100.0 + 10.0 * step)
        w.add_scalar("train/critic_lr", 9e-6, step, walltime=100.0 + 10.0 * step)
        w.add_scalar("train/response_length", 50.0, step, walltime=100.0 + 10.0 * step)
        if timing:  # ppo_trainer.py's status["timing/..."], logged under train/
            for key, sec in (("generation", 6.0), ("ppo_train", 3.0), ("step_total", 9.5)):
                w.add_scalar(f"train/timing/{key}", sec, step, walltime=100.0 + 10.0 * step)
        if step % 2 == 0:  # every evaluation logs eval_<dataset>_pass1, _pass<n> and lengths
            w.add_scalar("eval/eval_math_pass1", reward / 2, step, walltime=100.0 + 10.0 * step)
            w.add_scalar("eval/eval_math_pass4", reward, step, walltime=100.0 + 10.0 * step)
            w.add_scalar("eval/eval_response_length_mean", 60.0, step, walltime=100.0 + 10.0 * step)
    w.close()


def test_openrlhf_tensorboard(tmp_path):
    write_run(tmp_path / "tb" / "ppo_0101T10:00", [0.1, 0.2, 0.3, 0.4])
    (run,) = read_log(tmp_path / "tb", "tensorboard", RunInfo(prompts=8, group_size=4, seed=1))
    steps = run.steps
    assert [s.samples for s in steps] == [32, 64, 96, 128]  # rollout step * P * G
    assert [s.metrics["reward"] for s in steps] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert [s.metrics.get("eval_reward") for s in steps] == [
        None,
        pytest.approx(0.1),
        None,
        pytest.approx(0.2),
    ]
    assert [s.lr for s in steps] == pytest.approx([5e-7] * 4) and run.lr == pytest.approx(5e-7)
    assert [s.other_s for s in steps] == [0.0, 10.0, 10.0, 10.0]  # wall-clock between logged steps
    assert steps[-1].tokens == 128 * 50
    assert (run.candidate, run.seed, run.run_id) == ("P8xG4", 1, "ppo_0101T10-00")


def test_openrlhf_timing_is_read_from_its_own_keys(tmp_path):
    """OpenRLHF logs its generation, update and whole-step seconds: they were ignored for the wall
    clock between events (eval and checkpoint time included, the first step lost)."""
    write_run(tmp_path / "tb" / "run", [0.1, 0.2, 0.3], timing=True)
    (run,) = read_log(tmp_path / "tb", "tensorboard", RunInfo(prompts=8, group_size=4))
    assert [(s.gen_s, s.train_s, s.other_s) for s in run.steps] == [(6.0, 3.0, 0.5)] * 3


def test_one_run_per_event_folder(tmp_path):
    write_run(tmp_path / "tb" / "a", [0.1, 0.2])
    write_run(tmp_path / "tb" / "b", [0.3, 0.4])
    runs = read_log(tmp_path / "tb", "tensorboard", RunInfo(prompts=2, group_size=4, run_id="exp"))
    assert sorted(r.run_id for r in runs) == ["exp-a", "exp-b"]


def test_tensorboard_key_mapping_and_errors(tmp_path):
    write_run(tmp_path / "tb", [0.1, 0.2])
    info = RunInfo(prompts=2, group_size=4)
    (run,) = read_log(tmp_path / "tb", "tensorboard", info, {"reward": "train/policy_loss"})
    assert run.steps[0].metrics["reward"] == pytest.approx(-0.1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no TensorBoard event files"):
        read_log(tmp_path / "empty", "tensorboard", info)
    with pytest.raises(InputError, match="no such file or folder"):
        read_log(tmp_path / "missing", "tensorboard", info)
    # another file of the run's folder stood for the folder, and imported its run
    (tmp_path / "tb" / "README.txt").write_text("notes")
    with pytest.raises(InputError, match="README.txt is not a TensorBoard event file"):
        read_log(tmp_path / "tb" / "README.txt", "tensorboard", info)
    (event,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    assert len(read_log(event, "tensorboard", info)) == 1  # its event file does
