"""Issue 33 item 1: a checkpoint in a results directory cannot run code.

A planted ``state.pt`` whose pickle calls a function when unpickled (``__reduce__``) must be refused
with its path before anything in it runs, by the branched probe's RL checkpoints and the
pre-training run's resume alike; a real checkpoint still round-trips (the exact-resume tests in
test_torch_rl.py and test_pretrain_lm.py use the same reader).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from batchtune.backends.checkpoint_file import read_state
from batchtune.backends.spec import RunFailed
from batchtune.errors import UnsafeCheckpoint

ROOT = Path(__file__).resolve().parents[2]


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def plant(file: Path, marker: Path) -> Path:
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"policy": _Payload(marker), "seed": 0}, file)
    return file


def test_a_planted_pickle_in_an_rl_checkpoint_is_refused_and_never_runs(tmp_path: Path) -> None:
    from batchtune.backends.torch_rl import checkpoint

    marker = tmp_path / "ran"
    ckpt = tmp_path / "ckpts" / "ckpt-32"
    plant(ckpt / "state.pt", marker)
    with pytest.raises(UnsafeCheckpoint, match=r"refused the checkpoint .*ckpt-32.state\.pt.*could run code"):
        checkpoint.load(ckpt, learner=None, sampler=None, seed=0)
    assert not marker.exists()


def test_a_planted_pickle_in_a_pretraining_checkpoint_is_refused_and_never_runs(tmp_path: Path) -> None:
    from batchtune.backends.pretrain_lm import LMRun
    from batchtune.recipe.load import load_recipe

    marker = tmp_path / "ran"
    file = plant(tmp_path / "state.pt", marker)
    recipe = load_recipe(str(ROOT / "recipes/tiny-pretrain.toml"))
    with pytest.raises(UnsafeCheckpoint, match="refused the checkpoint") as info:
        LMRun.resume_from(file, recipe)
    assert info.value.exit_code == 2 and not marker.exists()  # stops the probe: not a failed run


def test_plain_state_round_trips_and_garbage_is_a_clear_failure(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    rng.random(5)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    state = {"rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "opt": opt.state_dict(),
             "order": [3, 1, 2], "counters": {"step": 2, "samples": 32}}  # fmt: skip
    torch.save(state, tmp_path / "ok.pt")
    back = read_state(tmp_path / "ok.pt")
    assert back["rng"] == state["rng"] and torch.equal(back["torch_rng"], state["torch_rng"])
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunFailed, match="cannot read the checkpoint .*bad.pt"):
        read_state(tmp_path / "bad.pt")


def test_no_torch_load_in_the_package_unpickles_arbitrary_objects() -> None:
    loose = []
    for path in (ROOT / "batchtune").rglob("*.py"):
        for call in re.findall(r"torch\.load\([^)]*\)", path.read_text()):
            if "weights_only=True" not in call:
                loose.append(f"{path.relative_to(ROOT)}: {call}")
    assert not loose
