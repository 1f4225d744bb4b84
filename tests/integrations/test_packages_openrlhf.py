"""OpenRLHF itself parses every flag batchtune emits for it (marker ``trainers``; .ci/trainers.sh).

``openrlhf/cli/train_ppo_ray.py`` builds its parser inside ``if __name__ == "__main__":``, after
importing ray, DeepSpeed and the vLLM engines, which do not load without a GPU stack. The test
extracts that block from the installed file (``ast``) and runs it with ``train`` replaced by a
function that keeps the arguments: the real ``add_argument`` calls, ``parse_args`` (an unknown flag
or a bad value exits 2) and the checks that follow it (its assertions included), nothing stubbed
in sys.modules. The flat (pre-0.10.2) names are judged by the same file of OpenRLHF 0.9.10 when
``OPENRLHF_LEGACY_CLI`` names it (.ci/trainers.sh downloads it), else skipped.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from batchtune.integrations.trainer_configs import read_trainer_config
from tests.integrations.packages_cases import EXAMPLES, Emitted, all_emitted, command_words, resume_words

pytestmark = pytest.mark.trainers
_SPEC = importlib.util.find_spec("openrlhf")
if _SPEC is None or _SPEC.origin is None:
    pytest.skip("OpenRLHF is not installed (.ci/trainers.sh installs it)", allow_module_level=True)
CLI = Path(_SPEC.origin).parent / "cli" / "train_ppo_ray.py"
LEGACY_CLI = os.environ.get("OPENRLHF_LEGACY_CLI", "")
# what a user adds after the emitted flags ("... models, data, reward"): a model and a reward model
USER_FLAGS = ["--actor.model_name_or_path", "m", "--reward.model_name_or_path", "rm"]
LEGACY_USER_FLAGS = ["--pretrain", "m", "--reward_pretrain", "rm"]


def _hierarchize(args):
    """openrlhf/utils/config.py's hierarchize, loaded from its file (its package imports DeepSpeed)."""
    path = CLI.parent.parent / "utils" / "config.py"
    spec = importlib.util.spec_from_file_location("openrlhf_config", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.hierarchize(args)


def _main_block(path: Path) -> ast.Module:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            body = [
                n
                for n in node.body
                if not (isinstance(n, ast.ImportFrom) and n.module == "openrlhf.utils.config")
            ]
            return ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    raise AssertionError(f"{path}: no __main__ block")


def run_cli(path: Path, argv: list[str]):
    """train_ppo_ray's __main__ block on ``argv``: the parsed (and validated) arguments."""
    kept: list = []
    code = compile(_main_block(path), str(path), "exec")
    # the file's standard-library imports (its others, ray and the engines, are what train() uses)
    scope = {"__name__": "__main__", "train": kept.append, "hierarchize": _hierarchize}
    scope.update(argparse=argparse, os=os, datetime=datetime)
    old = sys.argv
    sys.argv = [str(path), *argv]
    try:
        exec(code, scope)
    finally:
        sys.argv = old
    assert kept, "train() was not reached"
    return kept[0]


def flags_of(e: Emitted) -> list[str]:
    words = command_words(e.text)
    if words[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]:
        words = words[3:]
    return words + resume_words(e.text)


def _get(args, flag: str):
    obj = args
    for part in flag.lstrip("-").split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> list[Emitted]:
    return all_emitted("openrlhf", tmp_path_factory.mktemp("openrlhf"))


def test_openrlhf_parses_every_emitted_flag(emitted):
    current = [e for e in emitted if not e.options.get("legacy_flags")]
    assert len(current) >= 15
    for e in current:
        flags = flags_of(e)
        args = run_cli(CLI, flags + USER_FLAGS)
        assert isinstance(args, SimpleNamespace)
        for flag, value in (e.values or {}).items():  # each value reached OpenRLHF as written
            assert (
                _get(args, flag) == pytest.approx(value)
                if isinstance(value, float)
                else (_get(args, flag) == value)
            ), (e.label, flag)
        # check reads what OpenRLHF parsed
        got = read_trainer_config_text(e.text)
        assert (got.prompts, got.group_size) == (args.rollout.batch_size, args.rollout.n_samples_per_prompt)
        if got.lr is not None:
            assert got.lr == pytest.approx(args.actor.adam.lr)


def read_trainer_config_text(text: str):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
        f.write(text)
    try:
        return read_trainer_config(f.name, "openrlhf")
    finally:
        os.unlink(f.name)


@pytest.mark.parametrize("flag", [["--rollout.batch_sizee", "8"], ["--rollout.batch_size", "eight"]])
def test_openrlhf_refuses_what_it_does_not_know(flag):
    """The judge can fail: argparse exits 2 on an unknown flag or a value of the wrong type."""
    with pytest.raises(SystemExit) as exc:
        run_cli(CLI, flag + USER_FLAGS)
    assert exc.value.code == 2


@pytest.mark.skipif(not LEGACY_CLI, reason="OPENRLHF_LEGACY_CLI not set (a 0.9.x train_ppo_ray.py)")
def test_legacy_flags_parse_with_the_old_cli(emitted):
    legacy = [e for e in emitted if e.options.get("legacy_flags")]
    assert legacy
    for e in legacy:
        args = run_cli(Path(LEGACY_CLI), flags_of(e) + LEGACY_USER_FLAGS)
        for flag, value in (e.values or {}).items():
            assert getattr(args, flag.lstrip("-")) == value, (e.label, flag)


@pytest.mark.parametrize("name", ["train_ppo_ray.sh"])
def test_shipped_openrlhf_example_parses(name):
    path = EXAMPLES / "openrlhf" / name
    args = run_cli(CLI, flags_of(Emitted(name, path.read_text(), None, {})) + USER_FLAGS)
    got = read_trainer_config(path, "openrlhf")
    assert (got.prompts, got.group_size) == (args.rollout.batch_size, args.rollout.n_samples_per_prompt)
