"""Import hygiene: the layers' arrows point down, the pure modules import no engine, `--help` does not
import torch, and `recommend`/`pretrain` on stored records run without torch."""

from __future__ import annotations

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


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_pure_modules_import_without_engines():
    code = (
        "import sys\n"
        f"for m in {PURE!r}: __import__(m)\n"
        f"bad = sorted(h for h in {HEAVY!r} if h in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    assert _run(code) == "", "a pure module imported an engine or UI"


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


def test_help_does_not_import_torch():
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom batchtune.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0\n"
        "for sub in ['probe', 'profile-gen', 'recommend', 'tune', 'pretrain', 'import-logs']:\n"
        "    assert CliRunner().invoke(app, [sub, '--help']).exit_code == 0\n"
        "print('torch' in sys.modules, 'scipy' in sys.modules)\n"
    )
    assert _run(code) == "False False"


@pytest.fixture(scope="module")
def nqm_results(tmp_path_factory) -> Path:
    """A probe and a profile of the NQM recipe (simulated: no torch), as records on disk."""
    from typer.testing import CliRunner

    from batchtune.cli import app

    results = tmp_path_factory.mktemp("stored") / "r"
    small = ["--set", "budget.seeds=[0, 1]", "--set", "candidates.prompts=[1, 4, 16, 64]"]
    # what is imported is the point here, not the answer: a smaller, fixed probe
    small += ["--set", "budget.max_extra_seeds=0", "--set", "nqm.dim=200"]
    probe = ["probe", "nqm", "-r", str(results), "--json", *small]
    for cmd in (probe, ["profile-gen", "nqm", "-r", str(results), "--json"]):
        out = CliRunner().invoke(app, cmd)
        assert out.exit_code == 0, out.output
    return results


def test_recommend_on_stored_records_never_imports_torch(nqm_results):
    code = (
        "import sys, json\nfrom typer.testing import CliRunner\nfrom batchtune.cli import app\n"
        f"r = CliRunner().invoke(app, ['recommend', '-r', {str(nqm_results)!r}, '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "data = json.loads(r.stdout)\n"
        "print(data['throughput_source'].split()[0], 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    assert _run(code) == "profile-gen False False"


def test_pretrain_on_a_csv_never_imports_torch(tmp_path):
    rows = ["run,batch_tokens,step,loss"]
    for b in (1024, 4096, 16384):
        for s in range(1, 60):
            rows.append(f"b{b},{b},{s},{4.0 / (1 + s * b / 8000) ** 0.5 + 2.0:.5f}")
    csv = tmp_path / "losses.csv"
    csv.write_text("\n".join(rows) + "\n")
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom batchtune.cli import app\n"
        f"r = CliRunner().invoke(app, ['pretrain', {str(csv)!r}, '--targets', '3.0,2.8', '--json'])\n"
        "assert r.exit_code in (0, 3), r.output\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    assert _run(code) == "False False"
