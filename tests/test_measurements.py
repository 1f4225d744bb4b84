"""Measurements files: validation, curves per seed, bad input gives one clear line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from batchtune.analysis.decide.recommend import recommend
from batchtune.cli import app
from batchtune.errors import InputError
from batchtune.integrations.measurements import (
    assess_measurements,
    load_measurements,
    throughput_from_measurements,
)


def _curve_block(samples_to_target: float, seed: int, rng) -> str:
    s = np.linspace(0, 3 * samples_to_target, 30)
    m = np.clip(s / samples_to_target * 0.5 + rng.normal(0, 0.01, s.size), 0, None)
    return (
        f"[[candidate.curve]]\nseed = {seed}\nsamples = {list(map(float, s))}\n"
        f"metric = {list(map(float, m))}\n"
    )


def _study(path):
    """Three batches x three seeds of reward curves: 128 needs ~3x the samples of 8 and 32."""
    rng = np.random.default_rng(0)
    text = '[study]\nmetric = "reward"\ntarget = 0.5\n'
    for p, r, rps in [(8, 1000, 10.0), (32, 1050, 30.0), (128, 3000, 60.0)]:
        text += f'[[candidate]]\nprompts = {p}\ngroup_size = 8\nlr_rule = "sqrt"\nresponses_per_s = {rps}\n'
        for seed in range(3):
            text += _curve_block(r * rng.uniform(0.95, 1.05), seed, rng)
    path.write_text(text)
    return path


def test_curves_per_seed(tmp_path):
    path = _study(tmp_path / "m.toml")
    m = load_measurements(path)
    eff = assess_measurements(m)
    est = {c.label: c.estimate for c in eff.candidates}
    assert est["P8xG8"].n_seeds == 3
    assert est["P8xG8"].samples_to_target == pytest.approx(1000, rel=0.1)
    rec = recommend(eff, throughput_from_measurements(m))
    assert rec.ranking.winner == "P32xG8"  # ~same samples at 3x the throughput


_OK2 = (  # two valid candidates
    "[[candidate]]\nprompts=128\ngroup_size=8\nlr_rule='sqrt'\nsamples_to_target=1000\nresponses_per_s=10\n"
    "[[candidate]]\nprompts=256\ngroup_size=8\nlr_rule='sqrt'\nsamples_to_target=1000\nthroughput_ratio=1.5\n"
)
BAD = {
    "unknown key": (
        "[study]\nfoo = 1\n[[candidate]]\nprompts=1\ngroup_size=2\nsamples_to_target=5\n"
        "responses_per_s=1\n[[candidate]]\nprompts=2\ngroup_size=2\nsamples_to_target=5\n"
        "responses_per_s=1\n",
        "study.foo: unknown key",
    ),
    "one candidate": (
        "[[candidate]]\nprompts=1\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n",
        "at least two",
    ),
    "no throughput": (
        "[[candidate]]\nprompts=1\ngroup_size=2\nsamples_to_target=5\n"
        "[[candidate]]\nprompts=2\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n",
        "give responses_per_s",
    ),
    "wrong type": (
        '[[candidate]]\nprompts="1"\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n'
        "[[candidate]]\nprompts=2\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n",
        r"candidate\[0\]\.prompts: expected an integer",
    ),
    "not toml": ("[[candidate\n", "not valid TOML"),
    # accepted before, and changed the answer or failed later with exit 3 and no file named
    "unknown lr rule": (
        _OK2.replace("lr_rule='sqrt'", "lr_rule='cubic'", 1),
        "lr_rule: 'cubic' is not one of",
    ),
    "two throughputs": (
        _OK2.replace("responses_per_s=10", "responses_per_s=10\nthroughput_ratio=2"),
        "not several",
    ),
    "value and curve": (
        "[study]\ntarget=1\n"
        + _OK2.replace("responses_per_s=10", "responses_per_s=10\ncurve=[{samples=[1], metric=[1]}]"),
        "not both",
    ),
    "samples go back": (
        "[study]\ntarget=1\n"
        + _OK2.replace(
            "samples_to_target=1000\nresponses_per_s=10",
            "responses_per_s=10\ncurve=[{samples=[8, 4], metric=[0, 1]}]",
        ),
        "never decrease",
    ),
    "repeated seed": (
        "[study]\ntarget=1\n"
        + _OK2.replace(
            "samples_to_target=1000\nresponses_per_s=10",
            "responses_per_s=10\ncurve=[{seed=0, samples=[4], metric=[1]},\n"
            "{seed=0, samples=[4], metric=[1]}]",
        ),
        "seeds repeat",
    ),
    "seed not a number": (  # crashed with exit 70: an unhashable seed met the repeat check
        "[study]\ntarget=1\n"
        + _OK2.replace(
            "samples_to_target=1000\nresponses_per_s=10",
            "responses_per_s=10\ncurve=[{seed=[1], samples=[4], metric=[1]}]",
        ),
        r"curve\[0\]\.seed: expected an integer",
    ),
    "zero ratio": (_OK2.replace("throughput_ratio=1.5", "throughput_ratio=0"), "throughput_ratio: 0 must be"),
    "nan ratio": (
        _OK2.replace("throughput_ratio=1.5", "throughput_ratio=nan"),
        "throughput_ratio: nan must be",
    ),
    "inf samples": (
        _OK2.replace("samples_to_target=1000", "samples_to_target=inf", 1),
        "samples_to_target: inf",
    ),
    "negative tolerance": ("[study]\ntolerance=-0.5\n" + _OK2, "study.tolerance: -0.5 must be >= 0"),
    # typed by the recipe's table reader (recipe/tables.py): the field named by its full path
    "bool count": (
        _OK2.replace("prompts=128", "prompts=true"),
        r"candidate\[0\]\.prompts: expected an integer, got True",
    ),
    "text in a curve": (
        "[study]\ntarget=1\n"
        + _OK2.replace(
            "samples_to_target=1000\nresponses_per_s=10",
            "responses_per_s=10\ncurve=[{samples=[1, 'x'], metric=[0, 1]}]",
        ),
        r"candidate\[0\]\.curve\[0\]\.samples\[1\]: expected a number, got 'x'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_give_one_line_and_nonzero_exit(tmp_path, case):
    text, fragment = BAD[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=fragment):
        load_measurements(path)
    result = CliRunner().invoke(app, ["recommend", "--measurements", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.output.strip().startswith("error:")


def _two(reference_line: str = "", extra: str = "") -> str:
    return (
        f"[study]\n{reference_line}\n{extra}"
        "[[candidate]]\nprompts=128\ngroup_size=8\nlr_rule='sqrt'\nsamples_to_target=1000\nresponses_per_s=10\n"
        "[[candidate]]\nprompts=256\ngroup_size=8\nlr_rule='sqrt'\nsamples_to_target=1000\n"
        "throughput_ratio=1.5\n"
    )


def test_ratio_is_relative_to_the_default_reference(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(_two())
    m = load_measurements(path)
    rec = recommend(assess_measurements(m), throughput_from_measurements(m))
    by = {c.name: c for c in rec.ranking.candidates}
    assert by["P256xG8"].responses_per_s == pytest.approx(15.0)
    assert by["P256xG8"].time_ratio == pytest.approx(1 / 1.5)


def test_ppo_study_is_emitted_as_ppo(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        _two(extra='algorithm = "ppo"\n').replace(
            "lr_rule='sqrt'\n", "lr_rule='sqrt'\nlr=1e-6\ncritic_lr=1e-5\n"
        )
    )
    out = CliRunner().invoke(app, ["recommend", "-m", str(path), "--emit", "verl", "--gpus", "8", "--json"])
    assert out.exit_code == 0, out.output
    text = __import__("json").loads(out.stdout)["emitted"]["text"]
    assert "adv_estimator=grpo" not in text and "critic.optim.lr" in text


@pytest.mark.parametrize(
    "text",
    [
        "study = 3\n",
        "[[candidate]]\nprompts=1\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n"
        "curve=[{samples=5, metric=1}]\n"
        "[[candidate]]\nprompts=2\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n",
        "[study]\ntarget=1\n[[candidate]]\nprompts=1\ngroup_size=2\nresponses_per_s=1\n"
        "curve=[{samples=[1,2], metric=['x','y']}]\n"
        "[[candidate]]\nprompts=2\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n",
        "[[candidate]]\nprompts=1\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n"
        "samples_ci=['a', 9]\n"
        "[[candidate]]\nprompts=2\ngroup_size=2\nsamples_to_target=5\nresponses_per_s=1\n",
    ],
)
def test_malformed_values_are_reported_not_crashed(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = CliRunner().invoke(app, ["recommend", "--measurements", str(path)])
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error:")


def test_the_time_table_shows_the_statistic_its_rank_follows(tmp_path):
    """The rank orders by expected time (the point moved by the skew of its interval), which can put
    a larger median T/T0 first: the table shows E[T]/T0 beside it, and the rule under it, so the
    winner is the lowest by what is shown (or within the stated tie margin of it)."""
    from rich.console import Console

    from batchtune.analysis.decide.recommend import TIE_MARGIN
    from batchtune.report.terminal import recommendation_table

    m = load_measurements(_study(tmp_path / "m.toml"))
    rec = recommend(assess_measurements(m), throughput_from_measurements(m))
    console = Console(record=True, width=220)
    console.print(recommendation_table(rec))
    out = console.export_text()
    assert "E[T]/T0" in out and "rank: by E[T]/T0" in out and f"within {TIE_MARGIN:.0%}" in out
    shown = {c.name: rec.ranking.expected_ratio(c) for c in rec.ranking.candidates if not c.censored}
    for name, ratio in shown.items():
        assert f"{ratio:.3f}" in out, name
    assert shown[rec.ranking.winner] <= min(shown.values()) * (1 + TIE_MARGIN)


def test_emit_out_says_when_it_replaced_a_file(tmp_path):
    path, out = tmp_path / "m.toml", tmp_path / "verl.overrides"
    path.write_text(_two())
    args = ["recommend", "-m", str(path), "--emit", "verl", "--gpus", "8", "--out", str(out)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0 and "replaced" not in first.output, first.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "(it replaced the file there)" in again.output
