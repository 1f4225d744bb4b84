"""Issue 33, items 6 and 7: input a new user (or an attacker) gives, and the message it gets back."""

from __future__ import annotations

import os
import sys

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import RecipeError
from batchtune.recipe.load import load_recipe, shipped_recipes

NQM = str(shipped_recipes()["nqm"])


def _err(args: list[str]) -> str:
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, (out.exit_code, out.output)
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---- item 6 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reward", ["os:system", "subprocess:call", "builtins:exec", "json:loads"])
def test_a_standard_library_reward_is_refused_by_validate(tmp_path, reward):
    recipe = tmp_path / "r.toml"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a="}\n' * 4)
    recipe.write_text(f'[task]\nname = "jsonl"\nprompts_file = "{prompts}"\nreward = "{reward}"\n')
    err = _err(["recipes", "validate", str(recipe)])
    assert "task.reward" in err and "standard-library" in err and "your own" in err


def test_a_private_reward_name_is_refused():
    with pytest.raises(RecipeError, match="public Python names"):
        load_recipe(None, ['task.reward="my_rewards:_hidden"'])


def test_a_set_value_with_a_newline_is_refused():
    with pytest.raises(RecipeError, match="one value on one line"):
        load_recipe(None, ['optimizer.lr=3e-4\n[run]\nresults_dir = "/tmp/elsewhere"'])
    cfg = load_recipe(None, ["optimizer.lr=3e-4"])
    assert cfg.optimizer.lr == 3e-4


def test_report_md_escapes_imported_names():
    from batchtune.report.html import Section, to_markdown

    evil = "<script>alert(1)</script>"
    md = to_markdown(
        f"batchtune report: {evil}",
        f"target {evil}",
        [Section("Runs", (f"metric {evil}\n# injected heading",), (("run", "value"), (evil, "1 | 2")))],
        image_root=__import__("pathlib").Path("."),
    )
    assert "<script" not in md and "&lt;script>" in md
    assert "\n# injected" not in md
    assert "R/R0 <= 1.1" in to_markdown("t", "s", [Section("x", ("R/R0 <= 1.1",))], image_root=".")


# ---- item 7 ---------------------------------------------------------------------------------------
def test_a_recipe_with_a_bom_loads(tmp_path):
    p = tmp_path / "bom.toml"
    p.write_bytes(b"\xef\xbb\xbf[optimizer]\nlr = 0.002\n")
    assert load_recipe(p).optimizer.lr == 0.002


def test_a_csv_with_a_bom_is_read(tmp_path):
    from batchtune.integrations.common import RunInfo
    from batchtune.integrations.logs_generic import read_table

    p = tmp_path / "log.csv"
    p.write_bytes(b"\xef\xbb\xbfstep,reward\n1,0.1\n2,0.2\n")
    (run,) = read_table(p, info=RunInfo(prompts=4, group_size=2, lr=1e-3, seed=0))
    assert [s.metrics["reward"] for s in run.steps] == [0.1, 0.2]


def test_a_quoted_dotted_key_says_to_use_a_table(tmp_path):
    p = tmp_path / "q.toml"
    p.write_text('"optimizer.lr" = 1e-3\n')
    with pytest.raises(RecipeError, match=r"\[optimizer\]") as exc:
        load_recipe(p)
    assert "unquoted" in str(exc.value) and "unknown key" not in str(exc.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    assert "not a regular file" in _err(["recipes", "validate", str(fifo)])
    log = tmp_path / "pipe.csv"
    os.mkfifo(log)
    err = _err(["import-logs", str(log), "-f", "csv", "-r", str(tmp_path / "r")])
    assert "not a regular file" in err and "no such file" not in err


def test_runs_replaced_by_a_file_is_named(tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    (results / "runs").write_text("not a folder")
    err = _err(["recommend", NQM, "--results", str(results)])
    assert "is a file, not the runs folder" in err


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("budget.seeds=[0, 0]", "budget.seeds: [0] repeated"),
        ("optimizer.grad_clip=-1", "optimizer.grad_clip"),
        ("target.value=1e308", "target.value"),
    ],
)
def test_values_that_would_mislead_are_refused(override, fragment):
    with pytest.raises(RecipeError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        load_recipe(None, [override])


def test_zero_grad_clip_still_means_no_clipping():
    assert load_recipe(None, ["optimizer.grad_clip=0"]).optimizer.grad_clip == 0
    assert sys.version_info >= (3, 10)  # sys.stdlib_module_names, which the reward check reads


# ---- item 9: import-logs --------------------------------------------------------------------------
def _two_runs_csv(path, run_col: str = "run") -> None:
    rows = [f"{run_col},prompts,group_size,lr,seed,step,score"]
    for seed in (0, 1):
        rows += [f"a-s{seed},4,8,1e-4,{seed},{s},{0.1 * s:.2f}" for s in range(1, 6)]
    path.write_text("\n".join(rows) + "\n")


def test_a_default_target_metric_the_log_lacks_is_refused(tmp_path):
    log = tmp_path / "log.csv"
    _two_runs_csv(log)
    err = _err(["import-logs", str(log), "-f", "csv", "-r", str(tmp_path / "r")])
    assert "'eval_reward'" in err and "score" in err
    assert not (tmp_path / "r").exists()


def test_a_run_id_column_names_runs_without_map(tmp_path):
    log = tmp_path / "log.csv"
    _two_runs_csv(log, run_col="run_id")
    out = CliRunner().invoke(
        app, ["import-logs", str(log), "-f", "csv", "-r", str(tmp_path / "r"), "--metric", "score", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert sorted(__import__("json").loads(out.stdout)["added"]) == ["a-s0", "a-s1"]


def test_one_empty_file_is_reported_and_skipped(tmp_path):
    log, empty = tmp_path / "log.csv", tmp_path / "empty.csv"
    _two_runs_csv(log)
    empty.write_text("")
    args = ["import-logs", str(log), str(empty), "-f", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "skipped" in out.stdout and "empty.csv" in out.stdout and "imported 2 run(s)" in out.stdout
    assert "every file is empty" in _err(["import-logs", str(empty), "-f", "csv", "-r", str(tmp_path / "r2")])


# ---- item 15: the jargon explained where it is printed --------------------------------------------
def test_the_table_and_the_joint_fit_explain_their_terms(tmp_path):
    import shutil
    from pathlib import Path

    from batchtune.report import terminal

    results = tmp_path / "r"  # the shipped evidence of an NQM probe, read (not rerun) in a copy
    shutil.copytree(Path(__file__).parents[1] / "examples/ci/evidence/nqm", results)
    out = CliRunner().invoke(app, ["recommend", NQM, "--results", str(results)], terminal_width=400)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    for term in ("R/R0 paired:", "1+tol crossing:", "dAIC(mcc-pow) = AIC(McCandlish) - AIC(power)"):
        assert term in text, term
    assert "The number to act on:" in text and "not batches to run" in text
    assert "R/R0 paired" in terminal.TABLE_LEGEND


# ---- item 12: check and recommend say what is wrong -----------------------------------------------
def _evidence(tmp_path):
    import shutil
    from pathlib import Path

    results = tmp_path / "ev"
    shutil.copytree(Path(__file__).parents[1] / "examples/ci/evidence/nqm", results)
    return results


def test_check_passes_the_verl_config_recommend_emitted_on_eight_gpus(tmp_path):
    results, out = _evidence(tmp_path), tmp_path / "verl.txt"
    emit = CliRunner().invoke(
        app, ["recommend", NQM, "--results", str(results), "--emit", "verl", "-o", str(out)]
    )
    assert emit.exit_code == 0, emit.output
    assert "trainer.n_gpus_per_node=8" in out.read_text()
    got = CliRunner().invoke(app, ["check", str(out), "--results", str(results), "--json"])
    items = {c["name"]: c for c in __import__("json").loads(got.stdout)["checks"]}
    assert items["generation_concurrency"]["status"] == "pass", items["generation_concurrency"]


def test_check_of_a_readme_says_not_a_trainer_config(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\nIt's a \"quoted thing\n")
    err = _err(["check", str(readme), "--results", str(_evidence(tmp_path))])
    assert "not a trainer config" in err


def test_recommend_of_another_recipes_results_says_so(tmp_path):
    results = _evidence(tmp_path)
    err = _err(["recommend", "tiny-grpo", "--results", str(results)])
    assert "another recipe" in err and "nqm" in err and "no run logged" not in err


def test_no_pass_results_when_results_was_given(tmp_path):
    out = CliRunner().invoke(app, ["recommend", NQM, "--results", str(tmp_path / "none")])
    assert out.exit_code != 0 and "pass --results" not in out.output


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (["pretrain.batches_tokens=[10, 20, 32]"], ["10, 20 not a multiple", "seq_len = 16"]),
        (["pretrain.batches_tokens=[16, 32]"], ["2 given"]),
        (["pretrain.max_tokens=100"], ["max_tokens: 100 must exceed the largest batch, 512 tokens"]),
        (["pretrain.warmup_tokens=48000"], ["warmup_tokens: 48000 must be below max_tokens, 48000"]),
        (["pretrain.warmup_tokens=60000"], ["warmup_tokens: 60000 must be below max_tokens, 48000"]),
    ],
)
def test_a_pretrain_grid_error_says_which_values_are_wrong(sets, fragments):
    with pytest.raises(RecipeError) as exc:
        load_recipe(str(shipped_recipes()["tiny-pretrain"]), sets)
    for fragment in fragments:
        assert fragment in str(exc.value)
