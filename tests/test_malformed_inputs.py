"""A corpus of malformed inputs, kept as a test: every one exits 2 with exactly one line on stderr that
names the file or field and the problem, and writes nothing.

Recipes and --set values (every numeric field out of its range, NaN, infinity), recipe files,
measurements files, logs of each import format, pre-training CSVs and tampered results directories.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.recipe.load import shipped_recipes
from batchtune.recipe.ranges import ANY, RANGES
from batchtune.recipe.schema import Recipe

NQM = str(shipped_recipes()["nqm"])


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _check(args: list[str], fragment: str, root: Path) -> None:
    """Run the CLI in ``root``: exit 2, one stderr line holding ``fragment``, no file changed."""
    before = _tree(root)
    out = CliRunner().invoke(app, args)
    err = out.stderr.strip()
    assert out.exit_code == 2, (out.exit_code, err, out.stdout[-300:])
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    assert fragment in err, (fragment, err)
    assert _tree(root) == before, "nothing may be written"


# ---- --set: every numeric field, out of range / NaN / infinity ------------------------------------
def _bad_value(name: str) -> tuple[str, str]:
    """A value outside ``name``'s range, as TOML, and the text the error must hold."""
    rng = RANGES.get(name, ANY)
    if rng is ANY:
        return "nan", name
    bad = rng.lo - 1 if rng.lo > -1e300 else rng.hi * 10
    if rng.open_lo:
        bad = rng.lo
    value = repr(int(bad)) if float(bad).is_integer() and abs(bad) < 1e18 else repr(float(bad))
    return value, name


def _set_cases() -> list[tuple[str, str, str]]:
    from batchtune.recipe.ranges import numeric_fields

    cases = []
    for name, tp in sorted(numeric_fields(Recipe).items()):
        value, fragment = _bad_value(name)
        if getattr(tp, "__origin__", None) is list:
            value = f"[{value}]"
        elif getattr(tp, "__origin__", None) is dict:
            value = f'{{"8" = {value}}}'
        cases.append((name, value, fragment))
    return cases


@pytest.mark.parametrize(("key", "value", "fragment"), _set_cases())
def test_set_out_of_range(tmp_path, key, value, fragment):
    results = tmp_path / "r"
    _check(["probe", NQM, "-r", str(results), "--set", f"{key}={value}"], fragment, tmp_path)
    assert not results.exists()


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("target.tolerance=inf", "target.tolerance: inf"),
        ("target.tolerance=-inf", "target.tolerance"),
        ("optimizer.lr=nan", "optimizer.lr: nan"),
        ("target.value=nan", "target.value: nan"),
        ("budget.band_factor=-1", "budget.band_factor"),
        ("nqm.dim=0", "nqm.dim"),
        ("optimizer.beta1=2", "optimizer.beta1"),
        ("budget.diverge_factor=0", "budget.diverge_factor"),
        ("optimizer.lr='fast'", "optimizer.lr: expected a number"),
        ("candidates.prompts=8", "candidates.prompts: expected a list"),
        ("nosuch.key=1", "nosuch: unknown key"),
        ("optimizer.nosuch=1", "optimizer.nosuch: unknown key"),
        ("optimizer", "expected KEY=VALUE"),
        ("=3", "empty key"),
        ("run.results_dir=''", "run.results_dir"),
        ("algorithm.name='dpo'", "algorithm.name: 'dpo' is not one of"),
        ("model.hidden_size=65", "not divisible by num_heads"),
    ],
)
def test_set_malformed(tmp_path, monkeypatch, override, fragment):
    monkeypatch.chdir(tmp_path)  # no -r: an empty run.results_dir must not write here
    _check(["probe", NQM, "--set", override], fragment, tmp_path)


# ---- recipe files ------------------------------------------------------------------------------------
RECIPE_FILES: dict[str, tuple[bytes, str]] = {
    "non_utf8": (b'[target]\nmetric = "caf\xe9"\n', "not UTF-8"),
    "empty": (b"", "sets nothing"),
    "comments_only": (b"# nothing here\n", "sets nothing"),
    "bad_toml": (b"[target\nvalue = 1\n", "not valid TOML"),
    "unknown_section": (b"[nosuch]\nx = 1\n", "nosuch: unknown key"),
    "section_not_table": (b"target = 3\n", "target: expected a table"),
    "bool_for_int": (b"[nqm]\ndim = true\n", "nqm.dim: expected an integer"),
    "nan_literal": (b"[target]\ntolerance = nan\n", "target.tolerance: nan"),
    "inf_literal": (b"[optimizer]\nlr = inf\n", "optimizer.lr: inf"),
    "unknown_task": (b'[task]\nname = "revers"\n', "unknown task 'revers'"),
    "difficulty_0": (b"[task]\ndifficulty = 0\n", "task.difficulty: 0"),
    "arithmetic_too_big": (b"[task]\ndifficulty = 9\n", "arithmetic takes 1 to"),
    "missing_prompts": (b'[task]\nname = "jsonl"\nprompts_file = "no.jsonl"\nreward = "m:f"\n', "no.jsonl"),
    "bad_reward": (
        b'[task]\nname = "jsonl"\nprompts_file = "p.jsonl"\nreward = "nosuchmod:f"\n',
        "nosuchmod",
    ),
    "reward_no_colon": (
        b'[task]\nname = "jsonl"\nprompts_file = "p.jsonl"\nreward = "json"\n',
        "module:function",
    ),
    "reward_no_attr": (
        b'[task]\nname = "jsonl"\nprompts_file = "p.jsonl"\nreward = "json:nosuch"\n',
        "nosuch",
    ),
    "eval_size_0": (b"[task]\neval_size = 0\n", "task.eval_size: 0"),
    "tokens_past_positions": (b"[generation]\nmax_new_tokens = 400\n", "max_position_embeddings"),
    "heads": (b"[model]\nhidden_size = 66\n", "not divisible"),
    "kv_heads": (b"[model]\nnum_kv_heads = 3\n", "num_kv_heads"),
    "placeholder": (
        b'[backend]\ntraining = "command"\ncommand = ["python3", "{nosuch}"]\ncommand_log = "l.jsonl"\n',
        "unknown placeholder {nosuch}",
    ),
    "format_width": (
        b'[backend]\ntraining = "command"\ncommand = ["python3", "{lr:>300000000}"]\n'
        b'command_log = "l.jsonl"\n',
        "width or precision",
    ),
    "brace": (
        b'[backend]\ntraining = "command"\ncommand = ["python3", "{"]\ncommand_log = "l.jsonl"\n',
        "literal braces",
    ),
    "no_program": (
        b'[backend]\ntraining = "command"\ncommand = ["./no-such-trainer"]\ncommand_log = "l.jsonl"\n',
        "not found",
    ),
    "no_log": (b'[backend]\ntraining = "command"\ncommand = ["python3"]\n', "command_log"),
    "brackets_kept": (b"[candidates]\nprompts = []\n", "candidates.prompts"),
}


@pytest.mark.parametrize("name", sorted(RECIPE_FILES))
@pytest.mark.parametrize("command", ["probe", "validate"])
def test_recipe_file(tmp_path, monkeypatch, name, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "answer": "a"}\n' * 200)
    text, fragment = RECIPE_FILES[name]
    path = tmp_path / "r.toml"
    path.write_bytes(text)
    args = ["recipes", "validate", str(path)] if command == "validate" else ["probe", str(path), "-r", "res"]
    _check(args, fragment, tmp_path)


# ---- measurements files, logs, pre-training CSVs ------------------------------------------------------
GOOD_CSV = "run,prompts,group_size,lr,seed,step,reward\n" + "".join(
    f"r,4,8,0.001,0,{s},{0.1 * s}\n" for s in range(5)
)
LOGS: dict[str, tuple[str, bytes, str]] = {
    "csv_non_utf8": ("csv", b"run,prompts\n\xff\xfe,4\n", "not UTF-8"),
    "csv_inf_step": ("csv", GOOD_CSV.replace("r,4,8,0.001,0,3,", "r,4,8,0.001,0,inf,").encode(), "step"),
    "csv_nan_step": ("csv", GOOD_CSV.replace("r,4,8,0.001,0,3,", "r,4,8,0.001,0,nan,").encode(), "step"),
    "csv_text_lr": ("csv", GOOD_CSV.replace("0.001,0,2,", "abc,0,2,").encode(), "lr"),
    "csv_empty": ("csv", b"", "csv"),
    "csv_header_only": ("csv", b"run,prompts,group_size,lr,seed,step,reward\n", "csv"),
    "jsonl_garbage": ("jsonl", b'{"step": 1, "reward": 0.1}\nnot json\n{"step": 3}\n', "jsonl"),
    "jsonl_non_utf8": ("jsonl", b'{"step": 1, "reward": "\xff"}\n', "not UTF-8"),
    "jsonl_list": ("jsonl", b"[1, 2, 3]\n[4]\n", "jsonl"),
    "verl_garbage": ("verl", b"\x00\x01\x02 not a log", "log"),
    "wandb_non_utf8": ("wandb", b"\xff\xfe\x00", "not UTF-8"),
    "trl_not_json": ("trl", b"{not json", "trl"),
    "tensorboard_not_events": ("tensorboard", b"garbage", "no scalars"),
    "tensorboard_other_file": ("tensorboard", b"{}", "is not a TensorBoard event file"),
}


@pytest.mark.parametrize("name", sorted(LOGS))
def test_import_malformed_log(tmp_path, name):
    fmt, data, fragment = LOGS[name]
    path = tmp_path / f"log.{'csv' if fmt in ('csv', 'wandb') else 'jsonl'}"
    if name == "tensorboard_not_events":  # an event file's name, garbage inside
        path = tmp_path / "events.out.tfevents.1.host"
    path.write_bytes(data)
    args = ["import-logs", str(path), "-f", fmt, "-r", str(tmp_path / "res"), "--prompts", "4"]
    _check([*args, "--group-size", "8", "--lr", "1e-3"], fragment, tmp_path)


@pytest.mark.parametrize(
    ("option", "fragment"), [(["--target", "nan"], "target.value"), (["--target", "inf"], "target.value")]
)
def test_import_nonfinite_target(tmp_path, option, fragment):
    path = tmp_path / "log.csv"
    path.write_text(GOOD_CSV)
    _check(["import-logs", str(path), "-f", "csv", "-r", str(tmp_path / "res"), *option], fragment, tmp_path)


PRETRAIN = "run,batch_tokens,step,loss\n" + "".join(
    f"B{b},{b},{s},{4 - 0.1 * s}\n" for b in (1000, 2000, 4000) for s in range(1, 8)
)
PRETRAIN_CSVS: dict[str, tuple[bytes, str]] = {
    "negative_batch": (PRETRAIN.replace("B1000,1000,", "B1000,-1000,").encode(), "batch_tokens"),
    "zero_batch": (PRETRAIN.replace("B1000,1000,", "B1000,0,").encode(), "batch_tokens"),
    "nan_batch": (PRETRAIN.replace("B1000,1000,", "B1000,nan,").encode(), "batch_tokens"),
    "inf_step": (PRETRAIN.replace("B2000,2000,3,", "B2000,2000,inf,").encode(), "step"),
    "text_loss": (PRETRAIN.replace("B2000,2000,3,3.7", "B2000,2000,3,x").encode(), "loss"),
    "diverged_at_once": (  # one of three batches with no finite loss: too few batches, said why
        "".join(
            ln if not ln.startswith("B1000,") else ln.rsplit(",", 1)[0] + ",inf\n"
            for ln in PRETRAIN.splitlines(keepends=True)
        ).encode(),
        "diverged at once",
    ),  # fmt: skip
    "non_utf8": (b"run,batch_tokens,step,loss\n\xff,1,1,1\n", "not UTF-8"),
    "no_loss_column": (b"run,batch_tokens,step\nB1,1000,1\n", "loss"),
    "empty": (b"", "csv"),
}


@pytest.mark.parametrize("name", sorted(PRETRAIN_CSVS))
def test_pretrain_malformed_csv(tmp_path, name):
    data, fragment = PRETRAIN_CSVS[name]
    path = tmp_path / "losses.csv"
    path.write_bytes(data)
    _check(["pretrain", str(path)], fragment, tmp_path)


MEASUREMENTS: dict[str, tuple[bytes, str]] = {
    "non_utf8": (b'[study]\nmetric = "r\xe9"\n', "not UTF-8"),
    "bad_toml": (b"[study\n", "TOML"),
    "empty": (b"", "candidate"),
    "nan_target": (b'[study]\nmetric = "reward"\ntarget = nan\n', "two [[candidate]] tables"),
}


@pytest.mark.parametrize("name", sorted(MEASUREMENTS))
def test_measurements_malformed(tmp_path, name):
    data, fragment = MEASUREMENTS[name]
    path = tmp_path / "m.toml"
    path.write_bytes(data)
    _check(["recommend", "--measurements", str(path)], fragment, tmp_path)


# ---- tampered results directories ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    """A results directory made by import-logs (no training): two candidates, two seeds."""
    root = tmp_path_factory.mktemp("imported")
    rows = ["run,prompts,group_size,lr,seed,step,reward"]
    for p in (4, 16):
        for seed in (0, 1):
            rows += [
                f"P{p}-s{seed},{p},8,{1e-3 * (p / 4) ** 0.5},{seed},{s},{min(1, s * p / 40)}"
                for s in range(30)
            ]
    (root / "log.csv").write_text("\n".join(rows) + "\n")
    out = CliRunner().invoke(
        app,
        [
            "import-logs",
            str(root / "log.csv"),
            "-f",
            "csv",
            "-r",
            str(root / "res"),
            "--metric",
            "reward",
            "--target",
            "0.6",
        ],
    )
    assert out.exit_code == 0, out.output
    return root / "res"


def _run_json(res: Path) -> Path:
    return sorted(res.glob("runs/*/run.json"))[0]


def _edit_run(res: Path, **fields) -> None:
    path = _run_json(res)
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


_RERUN = "delete it and run the probe again"  # a damaged manifest: its finished runs are kept
TAMPER: dict[str, tuple[Callable[[Path], None], str]] = {
    "manifest_list": (lambda r: (r / "manifest.json").write_text("[1, 2]"), _RERUN),
    "manifest_no_recipe": (lambda r: (r / "manifest.json").write_text('{"source": "x"}'), "no recipe"),
    "manifest_bad_json": (lambda r: (r / "manifest.json").write_text("{"), _RERUN),
    "manifest_non_utf8": (lambda r: (r / "manifest.json").write_bytes(b'{"recipe": "\xff"}'), "not UTF-8"),
    "manifest_recipe_inf": (
        lambda r: (r / "manifest.json").write_text(json.dumps({"recipe": {"target": {"tolerance": "inf"}}})),
        "manifest.json",
    ),
    "run_string_number": (lambda r: _edit_run(r, samples="many"), "samples"),
    "run_string_lr": (lambda r: _edit_run(r, lr="fast"), "lr"),
    "run_bad_json": (lambda r: _run_json(r).write_text("{"), "run.json"),
    "run_list": (lambda r: _run_json(r).write_text("[]"), "run.json"),
    "run_missing_field": (lambda r: _run_json(r).write_text('{"run_id": "x"}'), "lacks"),
    "run_non_utf8": (lambda r: _run_json(r).write_bytes(b'{"run_id": "\xff"}'), "not UTF-8"),
    "steps_garbage_middle": (
        lambda r: (_run_json(r).parent / "steps.jsonl").write_text('{"x": 1}\nnot json\n{"y": 2}\n'),
        "steps.jsonl",
    ),
    "throughput_garbage": (lambda r: (r / "throughput.jsonl").write_text("nope\n{}\n"), "throughput.jsonl"),
}


@pytest.mark.parametrize("name", sorted(TAMPER))
def test_tampered_results_dir(tmp_path, imported, name):
    res = tmp_path / "res"
    shutil.copytree(imported, res)
    tamper, fragment = TAMPER[name]
    tamper(res)
    _check(["recommend", "--results", str(res)], fragment, tmp_path)


def test_the_corpus_is_large_enough():
    n = len(_set_cases()) + 17 + 2 * len(RECIPE_FILES) + len(LOGS) + 2 + len(PRETRAIN_CSVS)
    n += len(MEASUREMENTS) + len(TAMPER)
    assert n >= 100


def test_every_numeric_field_has_a_range():
    from batchtune.recipe.ranges import numeric_fields

    missing = sorted(set(numeric_fields(Recipe)) - set(RANGES))
    assert not missing, f"give these fields a range in recipe/ranges.py: {missing}"
    assert dataclasses.is_dataclass(Recipe)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tune", NQM, "--emit", "bogus"], "unknown trainer 'bogus' for --emit"),
        (["recommend", NQM, "--emit", "bogus"], "unknown trainer 'bogus' for --emit"),
        (["probe", NQM, "--workers", "0"], "--workers"),
        (["plan", NQM, "--time-steps", "-1"], "--time-steps"),
        (["tune", NQM, "--emit", "verl", "--gpus-per-node", "0"], "--gpus-per-node"),
    ],
)
def test_options_are_checked_before_anything_runs(tmp_path, args, fragment):
    """A typo in --emit used to surface after tune's probe and profile (hours on a real recipe);
    --workers 0 and --time-steps -1 were taken silently as the defaults."""
    results = tmp_path / "r"
    out = CliRunner().invoke(app, [*args, "-r", str(results)])
    assert out.exit_code == 2, out.output
    assert fragment in out.output and "Traceback" not in out.output
    assert not (results / "runs").exists()


@pytest.mark.parametrize("command", ["probe", "plan", "tune", "recommend", "profile-gen"])
def test_a_results_directory_that_is_a_file_is_named_as_such(tmp_path, command):
    """It stopped with "afile: File exists" (probe) or "afile/plan-timing/...: Not a directory" (plan)."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    out = CliRunner().invoke(app, [command, NQM, "-r", str(afile)])
    assert out.exit_code == 2, out.output
    assert f"results directory {afile} is a file" in out.output and afile.read_text() == "not a folder"
