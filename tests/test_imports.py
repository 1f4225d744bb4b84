"""Import hygiene: the layers' arrows point down, the pure modules import no engine, `--help` does not
import torch, `recommend`/`pretrain` on stored records run without torch, and the log readers
import no engine."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import batchtune.analysis as analysis

HEAVY = ("torch", "transformers", "vllm", "rich", "typer", "trl", "ray", "matplotlib")
ROOT = Path(__file__).resolve().parents[1]
# modules that must import nothing heavy: analysis/, the codec, records, recipes, measurements, report/json
PURE = [
    *(f"batchtune.analysis.{m.name}" for m in pkgutil.iter_modules(analysis.__path__)),
    "batchtune.codec",
    "batchtune.records",
    "batchtune.events",
    "batchtune.recipe.schema",
    "batchtune.recipe.load",
    "batchtune.recipe.checks",
    "batchtune.integrations.measurements",
    "batchtune.report.json",
]

# the log readers and emitters (`import-logs`, `--emit`) run where no trainer is installed
READERS = [
    f"batchtune.integrations{m}" for m in ("", ".readers", ".verl", ".trl", ".wandb", ".openrlhf", ".emit")
]


# Each check below needs a fresh interpreter, and each interpreter pays 1-2 s of CPU importing
# batchtune, so two interpreters run them all: one imports the pure modules alone (before anything
# heavy could be there), the other runs the CLI stages in this order, each adding only what it must
# (--help before anything imports scipy, then recommend and pretrain, which may import scipy).
_STAGES = """
import json, sys, traceback
args = json.loads(sys.argv[1])
out = {}

def stage(name, fn):
    try:
        out[name] = fn()
    except BaseException as exc:  # reported to the test of that stage; the others still run
        out[name] = "failed: " + "".join(traceback.format_exception_only(exc)).strip()[-2000:]

def pure():
    for m in args["pure"]:
        __import__(m)
    return ",".join(sorted(h for h in args["heavy"] if h in sys.modules))

def cli(argv, codes=(0,)):
    from typer.testing import CliRunner
    from batchtune.cli import app
    r = CliRunner().invoke(app, argv)
    assert r.exit_code in codes, r.output
    return r

def help_():
    cli(["--help"])
    for sub in ["probe", "profile-gen", "recommend", "tune", "pretrain", "import-logs"]:
        cli([sub, "--help"])
    return f"{'torch' in sys.modules} {'scipy' in sys.modules}"

def recommend():
    data = json.loads(cli(["recommend", "-r", args["results"], "--json"]).stdout)
    source = data["throughput_source"].split()[0]
    return f"{source} {'torch' in sys.modules} {'transformers' in sys.modules}"

def pretrain():
    cli(["pretrain", args["csv"], "--targets", "3.0,2.8", "--json"], codes=(0, 3))
    return f"{'torch' in sys.modules} {'transformers' in sys.modules}"

def readers():
    for m in args["readers"]:
        __import__(m)
    return ",".join(h for h in ("torch", "transformers", "tensorboard", "trl") if h in sys.modules)

stages = {"pure": pure, "readers": readers, "help": help_, "recommend": recommend, "pretrain": pretrain}
for name in args["stages"]:
    stage(name, stages[name])
print(json.dumps(out))
"""


def _fresh(**args) -> dict[str, str]:
    """What each stage of `_STAGES` named in ``args["stages"]`` saw, in one fresh interpreter."""
    args = {"pure": PURE, "heavy": HEAVY, "readers": READERS, **args}
    cmd = [sys.executable, "-c", _STAGES, json.dumps(args)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_cli(nqm_results: Path, tmp_path_factory) -> dict[str, str]:
    rows = ["run,batch_tokens,step,loss"]
    for b in (1024, 4096, 16384):
        for s in range(1, 60):
            rows.append(f"b{b},{b},{s},{4.0 / (1 + s * b / 8000) ** 0.5 + 2.0:.5f}")
    csv = tmp_path_factory.mktemp("csv") / "losses.csv"
    csv.write_text("\n".join(rows) + "\n")
    return _fresh(stages=["help", "recommend", "pretrain"], results=str(nqm_results), csv=str(csv))


@pytest.fixture(scope="module")
def fresh_pure() -> dict[str, str]:
    """The pure modules imported alone first, then the readers (what pure imported is read before)."""
    return _fresh(stages=["pure", "readers"])


def test_pure_modules_import_without_engines(fresh_pure):
    assert fresh_pure["pure"] == "", "a pure module imported an engine or UI"


def test_readers_do_not_import_torch(fresh_pure):
    """(Moved from tests/integrations/test_generic.py, which started an interpreter of its own.)"""
    assert fresh_pure["readers"] == "", "a log reader or emitter imported a trainer's engine"


def test_no_upward_arrows():
    """analysis never imports backends/measure/report/cli; measure never report; integrations never
    measure (docs/architecture.md). Checked on the source, lazy imports included."""
    forbidden = {
        "analysis": ("batchtune.backends", "batchtune.measure", "batchtune.report", "batchtune.cli",
                     "batchtune.workflow", "batchtune.integrations"),
        "measure": ("batchtune.report", "batchtune.cli", "batchtune.workflow"),
        "integrations": ("batchtune.measure", "batchtune.cli", "batchtune.workflow"),
        "backends": ("batchtune.measure", "batchtune.report", "batchtune.cli", "batchtune.workflow",
                     "batchtune.analysis.decide.recommend", "batchtune.integrations.emit"),
        "report": ("batchtune.measure", "batchtune.backends", "batchtune.cli", "batchtune.workflow"),
        "recipe": ("batchtune.measure", "batchtune.backends", "batchtune.report", "batchtune.cli"),
    }  # fmt: skip
    bad = []
    for layer, names in forbidden.items():
        for path in (ROOT / "batchtune" / layer).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                s = line.strip()
                if s.startswith(("from batchtune", "import batchtune")) and any(
                    s.split()[1] == n or s.split()[1].startswith(n + ".") for n in names
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{i}: {s}")
    assert not bad, "\n".join(bad)


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycles():
    """No module reaches itself through imports (lazy ones included): a file split to meet a line
    limit leaves exactly such a circle."""
    modules = {_module_of(p): p for p in (ROOT / "batchtune").rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for line in path.read_text().splitlines():
            s = line.strip()
            if not s.startswith(("from batchtune", "import batchtune")):
                continue
            target = s.split()[1]
            names = [n.strip(" ()") for n in s.split(" import ", 1)[1].split(",")] if " import " in s else []
            for cand in [f"{target}.{n.split(' as ')[0]}" for n in names] + [target]:
                if cand in modules and cand != mod:
                    graph[mod].add(cand)
                    break
    cycles, state = [], dict.fromkeys(graph, 0)

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state[n] == 1:
                cycles.append(" -> ".join([*stack[stack.index(n) :], n]))
            elif state[n] == 0:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_help_does_not_import_torch(fresh_cli):
    assert fresh_cli["help"] == "False False"


@pytest.fixture(scope="module")
def nqm_results(small_nqm: Path, tmp_path_factory) -> Path:
    """A probe and a profile of the NQM recipe (simulated: no torch), as records on disk: a copy of
    the session's small probe (what is imported is the point here, not the answer) plus a profile."""
    from typer.testing import CliRunner

    from batchtune.cli import app
    from tests.small_nqm import copy_of

    results = copy_of(small_nqm, tmp_path_factory.mktemp("stored") / "r")
    out = CliRunner().invoke(app, ["profile-gen", "nqm", "-r", str(results), "--json"])
    assert out.exit_code == 0, out.output
    return results


def test_recommend_on_stored_records_never_imports_torch(fresh_cli):
    assert fresh_cli["recommend"] == "profile-gen False False"


def test_pretrain_on_a_csv_never_imports_torch(fresh_cli):
    assert fresh_cli["pretrain"] == "False False"
