"""Every documented command that reads the sample logs in examples/logs/ runs as written (issue 33,
item 14): the fenced commands of README.md and docs/*.md that name ``examples/logs/``, and the
commands after them in the same block that read the results directory they wrote (``recommend
--results DIR``), run in order in a copy of the repository's examples/ and exit 0. The sample logs
are what examples/logs/make_logs.py writes, byte for byte. (docs/ci.md's examples/ci commands are
tests/test_ci_docs.py's.)"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(block: str) -> list[str]:
    """The ``batchtune`` command lines of a fenced block: continuations joined, comments dropped."""
    out: list[str] = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("batchtune "):
            out.append(line)
    return out


def _results_dir(argv: list[str]) -> str | None:
    for flag in ("--results", "-r"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return None


def documented() -> list[tuple[str, list[list[str]]]]:
    """(doc, commands in order) per fenced block holding an examples/logs command."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), flags=re.S):
            runs: list[list[str]] = []
            written: set[str] = set()
            for line in _commands(block):
                argv = shlex.split(line)[1:]
                where = _results_dir(argv)
                if "examples/logs/" in line:
                    runs.append(argv)
                    if where:
                        written.add(where)
                elif where in written:  # reads what an example command wrote
                    runs.append(argv)
            if runs:
                found.append((doc.relative_to(ROOT).as_posix(), runs))
    return found


BLOCKS = documented()


def test_the_docs_name_every_sample_log_and_each_log_ships():
    args = [a for _, runs in BLOCKS for argv in runs for a in argv]
    named = {m for a in args for m in re.findall(r"examples/logs/[\w./-]+", a)}
    assert {p for p in named if not (ROOT / p).exists()} == set()
    docs = {doc for doc, _ in BLOCKS}
    assert {"README.md", "docs/import-logs.md", "docs/pretraining.md"} <= docs
    formats = {argv[argv.index("--format") + 1] for _, runs in BLOCKS for argv in runs if "--format" in argv}
    assert {"verl", "trl", "wandb", "csv"} <= formats
    assert any(argv[0] == "pretrain" for _, runs in BLOCKS for argv in runs)


@pytest.mark.parametrize(("doc", "runs"), BLOCKS, ids=[f"{d}-{i}" for i, (d, _) in enumerate(BLOCKS)])
def test_a_documented_example_block_runs_as_written(doc: str, runs: list[list[str]], tmp_path, monkeypatch):
    shutil.copytree(LOGS, tmp_path / "examples" / "logs")
    monkeypatch.chdir(tmp_path)
    for argv in runs:
        out = CliRunner().invoke(app, argv)
        assert out.exit_code == 0, f"{doc}: batchtune {shlex.join(argv)}\n{out.output}"


def test_the_sample_logs_are_what_the_generator_writes(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("make_logs", LOGS / "make_logs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in module.FILES:
        assert (tmp_path / name).read_text() == (LOGS / name).read_text(), name
