"""Issue 33 item 2: untrusted files cannot hang or crash batchtune.

`batchtune check` is a CI gate on configs from pull requests. A YAML alias bomb (aliases multiply
the values flattened), a recursive alias, a 2000-deep mapping and 100k-deep TOML/JSON/JSONL lines
each end in exit 2 with one line naming the file, within seconds, writing nothing; recipes,
measurements files and logs read the same way.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app

DEEP = 100_000


def _alias_bomb() -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 12):  # 9**12 values once expanded
        prev = "a" if i == 1 else f"n{i - 1}"
        lines.append(f"n{i}: &n{i} {{" + ", ".join(f"k{j}: *{prev}" for j in range(9)) + "}")
    return "\n".join(lines) + "\n"


def _mapping_bomb() -> str:
    lines = ["a: &a {x: 1, y: 2}"]
    for i in range(1, 40):  # 2**40 scalars once expanded
        prev = "a" if i == 1 else f"n{i - 1}"
        lines.append(f"n{i}: &n{i} {{p: *{prev}, q: *{prev}}}")
    return "\n".join(lines) + "\n"


CONFIGS: dict[str, tuple[str, str, str]] = {
    "alias_bomb": ("yaml", _alias_bomb(), "expands to more than"),
    "mapping_bomb": ("yaml", _mapping_bomb(), "expands to more than"),
    "recursive_alias": ("yaml", "a: &a\n  b: *a\n", "contains itself"),
    "deep_yaml": ("yaml", "a: " + "{a: " * 2000 + "1" + "}" * 2000 + "\n", "nested deeper"),
    "deep_yaml_block": (
        "yaml",
        "".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "v: 1\n",
        "nested deeper",
    ),  # fmt: skip
    "deep_toml": ("toml", "a = " + "[" * DEEP + "]" * DEEP + "\n", "nested deeper"),
    "deep_json": ("json", '{"a": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}\n", "nested deeper"),
}


@pytest.fixture
def deadline() -> Iterator[None]:
    """A hang is a failure, not a stuck suite: 20 s per input."""

    def fire(*_: object) -> None:
        raise TimeoutError("still reading after 20 s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(args: list[str], fragment: str, root: Path) -> None:
    before = _tree(root)
    out = CliRunner().invoke(app, args)
    err = out.stderr.strip()
    assert out.exit_code == 2, (out.exit_code, err[-300:], repr(out.exception))
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err[-300:]
    assert fragment in err, (fragment, err)
    assert _tree(root) == before, "nothing may be written"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_check_refuses_bombs_and_deep_nesting_at_once(tmp_path: Path, deadline: None, name: str) -> None:
    suffix, text, fragment = CONFIGS[name]
    path = tmp_path / f"config.{suffix}"
    path.write_text(text)
    _refused(["check", str(path), "-r", str(tmp_path / "res")], fragment, tmp_path)


def test_a_config_with_merge_aliases_is_still_read(tmp_path: Path) -> None:
    from batchtune.integrations.config_files import read_flat

    path = tmp_path / "c.yaml"
    path.write_text("base: &base {lr: 1.0e-6, clip: 1.0}\nactor:\n  <<: *base\n  lr: 2.0e-6\n")
    flat, shape = read_flat(path, "verl")
    assert shape == "mapping" and flat["actor.lr"][0] == 2e-6 and flat["actor.<<.clip"][0] == 1.0


LOGS: dict[str, tuple[str, str, str]] = {
    "jsonl": ("log.jsonl", '{"step": 1, "reward": 0.1}\n' + '{"a": ' * DEEP + "1" + "}" * DEEP + "\n", ":2:"),
    "verl": ("log.jsonl", '{"step": 1, "data": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}\n", ":1:"),
    "trl": ("trainer_state.json", '{"log_history": ' + "[" * DEEP + "]" * DEEP + "}", "trainer_state"),
}


@pytest.mark.parametrize("fmt", sorted(LOGS))
def test_a_deep_log_line_is_an_input_error(tmp_path: Path, deadline: None, fmt: str) -> None:
    name, text, fragment = LOGS[fmt]
    (tmp_path / name).write_text(text)
    args = ["import-logs", str(tmp_path / name), "-f", fmt, "-r", str(tmp_path / "res"), "--prompts", "4"]
    _refused([*args, "--group-size", "8", "--lr", "1e-3"], fragment, tmp_path)


def test_deep_recipes_measurements_and_set_values_are_input_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deadline: None
) -> None:
    monkeypatch.chdir(tmp_path)  # probe with a bad --set must not write its results_dir here
    deep = "a = " + "[" * DEEP + "]" * DEEP + "\n"
    (tmp_path / "r.toml").write_text(deep)
    _refused(["recipes", "validate", str(tmp_path / "r.toml")], "nested too deep", tmp_path)
    (tmp_path / "m.toml").write_text(deep)
    _refused(["recommend", "--measurements", str(tmp_path / "m.toml")], "nested too deep", tmp_path)
    value = "[" * 5000 + "]" * 5000
    _refused(["probe", "nqm", "--set", f"optimizer.lr={value}"], "nested too deep", tmp_path)
    (tmp_path / "losses.jsonl").write_text('{"a": ' * DEEP + "1" + "}" * DEEP + "\n")
    _refused(["pretrain", str(tmp_path / "losses.jsonl")], "nested too deep", tmp_path)
