"""A planted NQM checkpoint stops the probe like a planted torch one (issue 33, drills): exit 2 in
one line naming the file, nothing in it loaded, and no run sealed from it. Before, np.load's
ValueError failed each branch as run data ("failed"), which reads as the batch failing."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from batchtune.backends.nqm import load_nqm_checkpoint, save_nqm_checkpoint
from batchtune.backends.spec import RunFailed
from batchtune.cli import app
from batchtune.errors import UnsafeCheckpoint
from batchtune.measure.branched import branched_store
from batchtune.recipe.load import shipped_recipes

NQM = str(shipped_recipes()["nqm"])
BRANCHED = ["probe.mode=branched", "branch.trunk_samples=1024", "branch.window_samples=512",
            "branch.checkpoints=[0.5, 1.0]", "candidates.prompts=[1, 8, 32]",
            "budget.seeds=[0, 1]"]  # fmt: skip


def _object_array_npz(file: Path) -> None:
    """The arrays batchtune writes, but theta an object array: its pickle names a function."""
    theta = np.array([print, 1.0], dtype=object)
    np.savez(file, theta=theta, m=np.zeros(2), v=np.zeros(2), counters=np.array([512, 512]))


def test_a_pickle_in_or_instead_of_an_npz_is_refused_and_junk_fails_the_run(tmp_path: Path):
    base = tmp_path / "ckpt-512"
    save_nqm_checkpoint(base, np.ones(3), np.zeros(3), np.zeros(3), 512, 64)
    theta, _, _, samples, step = load_nqm_checkpoint(base)
    assert theta.tolist() == [1.0, 1.0, 1.0] and (samples, step) == (512, 64)
    _object_array_npz(base.with_suffix(".npz"))
    with pytest.raises(UnsafeCheckpoint, match=r"refused the checkpoint .*ckpt-512\.npz: it holds a pickle"):
        load_nqm_checkpoint(base)
    import pickle

    base.with_suffix(".npz").write_bytes(pickle.dumps({"theta": [1.0]}))  # a pickle file in its place
    with pytest.raises(UnsafeCheckpoint, match="ckpt-512.npz"):
        load_nqm_checkpoint(base)
    base.with_suffix(".npz").write_bytes(b"not a checkpoint")  # damaged, not planted: the run fails
    with pytest.raises(RunFailed, match=r"cannot read the NQM checkpoint .*ckpt-512\.npz"):
        load_nqm_checkpoint(base)


def test_a_probe_resumed_over_a_planted_npz_stops_in_one_line_naming_it(tmp_path: Path):
    results = tmp_path / "r"
    cmd = ["probe", NQM, "-r", str(results), *[a for s in BRANCHED for a in ("--set", s)]]
    first = CliRunner().invoke(app, cmd)
    assert first.exit_code == 0, first.output
    store = branched_store(results)
    ckpt = store.root / "checkpoints" / "ckpt-512.npz"
    assert ckpt.is_file()
    _object_array_npz(ckpt)
    for rec in store.runs("c512-"):  # its branches and controls, to be run again from the file
        shutil.rmtree(store.run_dir(rec.run_id))
    again = CliRunner().invoke(app, cmd)
    assert again.exit_code == 2, again.output
    assert "refused the checkpoint" in again.output and "ckpt-512.npz" in again.output
    assert "Traceback" not in again.output
    assert store.runs("c512-") == []  # nothing sealed as failed from it
