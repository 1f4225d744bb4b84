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


def test_a_lock_on_a_read_only_file_system_is_held_without_a_lock_file(tmp_path, monkeypatch):
    """A finished probe answers from a read-only mount: the rounds lock (and a run's claim) cannot
    create its lock file there, and no other process can write there either, so it holds at once.
    Any other failure to open the lock file is still an error."""
    import errno

    from batchtune.records import files

    def failing(code: int):
        def open_(path, *args, **kwargs):
            raise OSError(code, os.strerror(code), str(path))

        return open_

    monkeypatch.setattr(files.os, "open", failing(errno.EROFS))
    with files.locked(tmp_path / ".rounds.lock") as got:
        assert got
    monkeypatch.setattr(files.os, "open", failing(errno.EACCES))
    with pytest.raises(PermissionError), files.locked(tmp_path / ".rounds.lock"):
        pass
