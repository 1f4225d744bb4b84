"""A file-size limit (or a full disk) is the environment, not a bug: exit 2 naming the file (issue 12).

Each case caps this process's RLIMIT_FSIZE (the soft limit only, so it can be lifted again) and
ignores SIGXFSZ while the command runs in process, so a write past the cap fails with EFBIG, as a
full disk fails with ENOSPC, instead of killing the process. The command's output goes to the
runner's memory buffers, not to a file, and both settings are restored before the test returns.
(It used to start a fresh interpreter per case: ~1.6 s of CPU each importing batchtune, for the same
message and exit code.)
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result

from batchtune.cli import app

resource = pytest.importorskip("resource")


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip(f"the hard file-size limit {hard} is below {limit}")
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


def _run_capped(limit: int, args: list[str]) -> Result:
    with _file_size_limit(limit):
        return CliRunner().invoke(app, args)


@pytest.mark.parametrize(
    ("limit_bytes", "named"),
    [(2_000, "manifest.json"), (100_000, "steps.jsonl")],  # an atomic rewrite; an appended log
)
def test_file_size_limit_exits_2_naming_the_file(tmp_path, limit_bytes, named):
    out = tmp_path / "r"
    args = ["probe", "nqm", "-r", str(out), "--set", "budget.seeds=[0]", "--set", "candidates.prompts=[1,2]"]
    result = _run_capped(limit_bytes, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: {out}") and named in lines[0] and "File too large" in lines[0]
    assert not list(out.glob(".*.tmp"))  # the failed atomic write left no temporary file


def test_writers_outside_the_results_store_name_their_file_too(tmp_path):
    """`recipes cp` (and every other writer: --emit --out, --junit, plots, the report) goes through
    one atomic writer: past the limit, exit 2 naming the file, no half-written file left behind."""
    dest = tmp_path / "mine.toml"
    result = _run_capped(200, ["recipes", "cp", "nqm", str(dest)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and str(dest) in lines[0] and "File too large" in lines[0]
    assert not dest.exists() and not list(tmp_path.glob(".*.tmp"))


def test_an_atomic_write_that_cannot_land_names_its_file_and_leaves_no_temporary(tmp_path):
    """A directory where the file belongs (or a read-only folder): the OSError names the file asked
    for, not the hidden temporary beside it, and that temporary is removed."""
    from batchtune.records.files import atomic_write_text

    target = tmp_path / "async_topup.json"
    target.mkdir()
    with pytest.raises(OSError) as err:
        atomic_write_text(target, "{}")
    assert err.value.filename == str(target)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("code", ["EACCES", "EROFS"])
def test_a_lock_that_cannot_be_opened_for_writing_is_held_read_only_or_not_at_all(
    tmp_path, monkeypatch, code
):
    """A finished probe answers from a results directory this user may not write (EACCES) or on a
    read-only mount (EROFS): the rounds lock (and a run's claim) cannot open its lock file read-write
    there. An existing lock file is flocked read-only (it still excludes another holder); a missing
    one cannot be made, nor can this process write there, so it holds at once. Any other failure to
    open the lock file is still an error."""
    import errno
    import fcntl

    from batchtune.records import files

    real_open = os.open
    fail: list[int] = []

    def open_(path, flags, *args, **kwargs):
        if fail and flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise OSError(fail[0], os.strerror(fail[0]), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", open_)
    lock = tmp_path / ".rounds.lock"
    fail[:] = [getattr(errno, code)]
    with files.locked(lock) as got:  # no lock file yet
        assert got
    assert not lock.exists()

    fail[:] = []  # (files.os is the os module: pathlib opens through it too)
    lock.touch(mode=0o444)
    fail[:] = [getattr(errno, code)]
    with files.locked(lock) as got:
        assert got
        other = real_open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # held: another open file description cannot take it
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    with files.locked(lock, blocking=False) as got:  # released
        assert got

    fail[:] = [errno.EIO]
    with pytest.raises(OSError, match="Input/output"), files.locked(lock):
        pass


def test_a_plot_cut_off_mid_write_leaves_no_truncated_png(tmp_path):
    """A plot whose write stops part-way (here past a file-size limit; a crash or a full disk alike)
    left a truncated PNG under its own name, which a later run and the report took for the plot. It
    is written beside it first and renamed: the old plot stays, or none is there, and no temporary."""
    from batchtune.report.plots import plot_learning_curves

    curves = {"P1xG8": [([0.0, 8.0, 16.0], [0.1, 0.4, 0.6])]}
    new, old = tmp_path / "new.png", tmp_path / "old.png"
    plot_learning_curves(curves, 0.5, "reward", old)
    drawn = old.read_bytes()
    assert len(drawn) > 4_000
    with _file_size_limit(2_000):
        for path in (new, old):
            with pytest.raises(OSError) as err:
                plot_learning_curves(curves, 0.5, "reward", path)
            assert err.value.filename == str(path)
    assert not new.exists() and old.read_bytes() == drawn
    assert not list(tmp_path.glob(".*.tmp"))
