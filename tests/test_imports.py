"""Import hygiene: the analysis core is pure, and `batchtune --help` does not import torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import batchtune.analysis as analysis

HEAVY = ("torch", "transformers", "vllm", "rich", "typer", "trl", "ray")


def test_analysis_imports_without_engines():
    modules = [f"batchtune.analysis.{m.name}" for m in pkgutil.iter_modules(analysis.__path__)]
    code = (
        "import sys\n"
        f"for m in {modules!r}: __import__(m)\n"
        f"bad = [h for h in {HEAVY!r} if h in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"analysis imported {out.stdout.strip()}"


def test_help_does_not_import_torch():
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom batchtune.cli import app\n"
        "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0\n"
        "for sub in ['probe', 'profile-gen', 'recommend', 'tune']:\n"
        "    assert CliRunner().invoke(app, [sub, '--help']).exit_code == 0\n"
        "print('torch' in sys.modules, 'scipy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"
