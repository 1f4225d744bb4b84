"""`batchtune import-logs` then `recommend`: runs users already have, analysed like probe runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.records.store import ResultsStore


def _write_sweep(path, rng):
    """A generic per-step CSV: three batch sizes x two seeds, reward curves with a known R(B)."""
    rows = ["run,prompts,group_size,lr,seed,step,score,gen_s,train_s"]
    true_r = {4: 2000.0, 16: 2100.0, 64: 6000.0}  # responses to reach 0.6
    for p, r in true_r.items():
        n = p * 8
        for seed in (0, 1):
            r_seed = r * rng.uniform(0.97, 1.03)
            for step in range(0, int(3 * r / n) + 2):
                score = 0.6 * min(1.5, step * n / r_seed)
                rows.append(
                    f"P{p}-s{seed},{p},8,{1e-4 * (p / 4) ** 0.5},{seed},{step},{score:.4f},"
                    f"{0.5 + 0.002 * n},{0.01 * n}"
                )
    path.write_text("\n".join(rows) + "\n")


def _import_sweep(tmp_path, target: str) -> None:
    """The generic sweep imported into ``tmp_path / "r"``, read to score >= ``target``."""
    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(0))
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    out = CliRunner().invoke(app, [*args, "--target", target])
    assert out.exit_code == 0, out.output


def test_import_then_recommend(tmp_path):
    rng = np.random.default_rng(0)
    log = tmp_path / "sweep.csv"
    _write_sweep(log, rng)
    results = tmp_path / "res"
    runner = CliRunner()
    out = runner.invoke(
        app,
        [
            "import-logs",
            str(log),
            "--format",
            "csv",
            "--results",
            str(results),
            "--metric",
            "score",
            "--target",
            "0.6",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["added"]) == 6
    again = runner.invoke(app, ["import-logs", str(log), "--format", "csv", "-r", str(results), "--json"])
    assert again.exit_code == 0, again.output
    assert len(json.loads(again.stdout)["skipped"]) == 6  # nothing is imported twice

    rec = runner.invoke(app, ["recommend", "--results", str(results), "--json"])
    assert rec.exit_code == 0, rec.output
    data = json.loads(rec.stdout)
    by = {c["name"]: c for c in data["candidates"]}
    assert by["P4xG8"]["samples_to_target"] == __import__("pytest").approx(2000, rel=0.06)
    assert by["P64xG8"]["status"] == "deviates"
    assert data["throughput_source"] == "timings from the imported logs"
    # 16 prompts: same samples, more throughput per response than 4 prompts; 64 needs 3x samples
    assert data["recommended"]["prompts"] == 16


def test_bad_log_is_one_line_and_writes_nothing(tmp_path):
    log = tmp_path / "bad.csv"
    log.write_text("run,prompts,group_size,lr,step,reward\nr,4,8,1e-4,0,0.1\nr,4,8,abc,1,0.2\n")
    results = tmp_path / "res"
    out = CliRunner().invoke(app, ["import-logs", str(log), "--format", "csv", "-r", str(results)])
    assert out.exit_code == 2
    assert "Traceback" not in out.output and "bad.csv:3" in out.output
    assert not results.exists()


def test_missing_file(tmp_path):
    out = CliRunner().invoke(app, ["import-logs", str(tmp_path / "nope.csv"), "-f", "csv"])
    assert out.exit_code == 2 and "not found" in out.output


def test_failed_import_leaves_the_manifest_alone(tmp_path):
    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(1))
    results = tmp_path / "res"
    runner = CliRunner()
    args = ["import-logs", str(log), "-f", "csv", "-r", str(results), "--metric", "score"]
    ok = runner.invoke(app, [*args, "--target", "0.6"])
    assert ok.exit_code == 0, ok.output
    before = (results / "manifest.json").read_text()
    clash = tmp_path / "clash.csv"
    clash.write_text(log.read_text())
    bad = runner.invoke(
        app, ["import-logs", str(log), str(clash), "-f", "csv", "-r", str(results), "--target", "0.95"]
    )
    assert bad.exit_code == 2, bad.output
    assert (results / "manifest.json").read_text() == before


def test_imported_subset_of_the_default_plan_still_recommends(tmp_path):
    """Imported P16/P64 runs: the default recipe's plan (reference P4) does not apply to them."""
    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(2))
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], *[ln for ln in lines[1:] if not ln.startswith("P4-")]]) + "\n")
    results = tmp_path / "res"
    runner = CliRunner()
    assert runner.invoke(app, ["import-logs", str(log), "-f", "csv", "-r", str(results), "--metric",
                               "score", "--target", "0.6"]).exit_code == 0  # fmt: skip
    out = runner.invoke(app, ["recommend", "-r", str(results), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["reference"] == "P16xG8"


def test_logs_without_timings_still_give_the_critical_batch(tmp_path):
    """No gen_s/train_s columns: no ranking, but the critical batch needs none, and the note says
    which throughput source would complete it."""
    rng = np.random.default_rng(1)
    log = tmp_path / "sweep.csv"
    _write_sweep(log, rng)
    lines = log.read_text().splitlines()
    log.write_text("\n".join(",".join(line.split(",")[:-2]) for line in lines) + "\n")  # drop timings
    results = tmp_path / "res"
    runner = CliRunner()
    args = ["import-logs", str(log), "--format", "csv", "-r", str(results), "--metric", "score"]
    assert runner.invoke(app, [*args, "--target", "0.6"]).exit_code == 0
    out = runner.invoke(app, ["recommend", "--results", str(results), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["recommended"] is None and "profile-gen" in data["throughput_missing"]
    assert data["critical_training_batch"]["batch_responses"] in (32.0, 128.0)  # 4x8 or 16x8 overlay
    by = {c["name"]: c for c in data["candidates"]}
    assert by["P64xG8"]["status"] == "deviates"  # 3x the samples: no estimator calls that invariant
    text = runner.invoke(app, ["recommend", "--results", str(results)])
    assert text.exit_code == 0 and "Critical training batch" in text.output


def test_two_logs_of_one_candidate_at_one_seed_are_refused_before_anything_is_written(tmp_path):
    """Two files imported at once each got --seed's value (0): the import stored both, and
    recommend then stopped with "seed_ids must be ... one distinct id per seed, got (0, 0)"."""
    runner = CliRunner()
    logs = []
    for s in (0, 1):
        log = tmp_path / f"run_P4_s{s}.jsonl"
        rows = [{"step": k, "score": min(1.0, 0.1 * k + 0.01 * s)} for k in range(12)]
        log.write_text("".join(json.dumps(r) + "\n" for r in rows))
        logs.append(str(log))
    args = ["--prompts", "4", "--group-size", "8", "--lr", "1e-4", "--metric", "score", "--target", "0.6"]
    both = runner.invoke(app, ["import-logs", *logs, "-r", str(tmp_path / "r"), *args])
    assert both.exit_code == 2, both.output
    assert "both P4xG8 at seed 0" in both.output and "--seed N" in both.output
    assert not (tmp_path / "r" / "runs").exists()
    for s, log in enumerate(logs):  # one at a time, each with its seed: fine, and recommend reads them
        one = runner.invoke(app, ["import-logs", log, "-r", str(tmp_path / "r"), *args, "--seed", str(s)])
        assert one.exit_code == 0, one.output
    again = runner.invoke(app, ["import-logs", logs[1], "-r", str(tmp_path / "r"), *args, "--seed", "0"])
    assert again.exit_code == 2 and "--seed N" in again.output  # another file at a stored seed
    other_lr = [*args[:4], "--lr", "2e-4", *args[6:]]  # the label is the candidate's, whatever its LR
    lr = runner.invoke(app, ["import-logs", logs[1], "-r", str(tmp_path / "r"), *other_lr, "--seed", "0"])
    assert lr.exit_code == 2 and "--seed N" in lr.output


def test_two_runs_of_one_file_at_one_seed_are_refused_naming_both(tmp_path):
    """A CSV with a run column and no seed column (or a W&B panel export): every run got seed 0, the
    check compared files only, and recommend, report and check then all stopped on the pair."""
    rows = ["run,prompts,group_size,lr,step,score"]
    rows += [f"{r},4,8,1e-4,{k},{min(1.0, 0.1 * k)}" for r in ("a", "b") for k in range(1, 12)]
    log = tmp_path / "sweep.csv"
    log.write_text("\n".join(rows) + "\n")
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    out = CliRunner().invoke(app, [*args, "--target", "0.6"])
    assert out.exit_code == 2, out.output
    assert "runs 'a' and 'b' of" in out.output and "both P4xG8 at seed 0" in out.output
    assert not (tmp_path / "r" / "runs").exists()


def test_the_step_time_a_log_records_beyond_generation_and_update_counts_in_the_ranking(tmp_path):
    """An imported log's other_s (verl's timing_s/step less gen and update, a wall clock) was stored
    and then dropped: the ranking added the recipe's 0 instead, and logs with only a wall clock had
    no ranking at all. 30 s of fixed overhead per step favours larger batches."""
    rng = np.random.default_rng(0)
    log = tmp_path / "sweep.csv"
    _write_sweep(log, rng)
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0] + ",other_s", *(ln + ",30" for ln in lines[1:])]) + "\n")
    runner = CliRunner()
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    assert runner.invoke(app, [*args, "--target", "0.6"]).exit_code == 0
    out = runner.invoke(app, ["recommend", "--results", str(tmp_path / "r"), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["throughput_source"] == "timings from the imported logs"
    by = {c["name"]: c for c in data["candidates"]}
    assert by["P4xG8"]["other_s_per_step"] == pytest.approx(30.0)
    n = 32
    assert by["P4xG8"]["responses_per_s"] == pytest.approx(n / (0.5 + 0.002 * n + 0.01 * n + 30), rel=1e-3)


def test_imported_runs_that_cannot_be_ranked_get_no_advice_to_rerun_a_probe(tmp_path):
    """The advice said "the probe is unfinished (0 of 8 planned runs finished); rerun the same
    `batchtune probe` command" of runs no probe made."""
    runner = CliRunner()
    _import_sweep(tmp_path, "7")
    out = runner.invoke(app, ["recommend", "--results", str(tmp_path / "r")])
    assert out.exit_code == 3, out.output
    assert "imported from logs" in out.output and "batchtune probe" not in out.output


def test_a_log_of_every_tenth_step_counts_the_time_of_all_ten(tmp_path):
    """TRL logs every logging_steps (10 by default): each entry's step time stands for ten steps, and
    the run's time was a tenth of what it ran (the probe-cost line read 18 min of a 3 h run)."""
    rows = ["run,prompts,group_size,lr,step,score,gen_s,train_s"]
    rows += [f"a,4,8,1e-4,{k},{min(1.0, 0.001 * k)},3.0,1.0" for k in range(10, 1510, 10)]
    log = tmp_path / "every10.csv"
    log.write_text("\n".join(rows) + "\n")
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    out = CliRunner().invoke(app, [*args, "--target", "0.6"])
    assert out.exit_code == 0, out.output
    (run,) = ResultsStore(tmp_path / "r").runs()
    assert run.steps == 1500 and run.wall_s == pytest.approx(1500 * 4.0)


def test_a_target_metric_no_run_logs_is_refused_at_import(tmp_path):
    """A misspelt --metric (or a column of text) imported with exit 0; only recommend failed."""
    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(0))
    runner = CliRunner()
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--target", "0.6"]
    out = runner.invoke(app, [*args, "--metric", "scroe"])
    assert out.exit_code == 2 and "'scroe': no run logs it" in out.output and "score" in out.output
    assert not (tmp_path / "r" / "runs").exists()
    assert runner.invoke(app, [*args, "--metric", "score"]).exit_code == 0


def test_a_third_imported_seed_is_not_called_sequential_seeding(tmp_path):
    """Imported seeds outside the stored recipe's budget.seeds were counted as sequential seeding
    ("3 (+1 seq.)" and a note on what it spent), a probe mechanism that never ran here."""
    rng = np.random.default_rng(0)
    log = tmp_path / "sweep.csv"
    _write_sweep(log, rng)
    lines = log.read_text().splitlines()
    more = [ln.replace("-s1,", "-s2,").replace(",1,", ",2,", 1) for ln in lines[1:] if "-s1," in ln]
    log.write_text("\n".join([*lines, *more]) + "\n")
    runner = CliRunner()
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    assert runner.invoke(app, [*args, "--target", "0.6"]).exit_code == 0
    assert {r.seed for r in ResultsStore(tmp_path / "r").runs()} == {0, 1, 2}
    out = runner.invoke(app, ["recommend", "--results", str(tmp_path / "r"), "--json"])
    data = json.loads(out.stdout)
    assert not any("sequential seeding" in n for n in data["notes"]), data["notes"]


def test_the_same_file_by_its_absolute_path_is_skipped_not_another_run(tmp_path, monkeypatch):
    """Imported once as a relative path, again as an absolute one: "... is another run"."""
    monkeypatch.chdir(tmp_path)
    _write_sweep(tmp_path / "sweep.csv", np.random.default_rng(0))
    args = ["--format", "csv", "-r", "r", "--metric", "score", "--target", "0.6", "--json"]
    runner = CliRunner()
    assert runner.invoke(app, ["import-logs", "sweep.csv", *args]).exit_code == 0
    again = runner.invoke(app, ["import-logs", str(tmp_path / "sweep.csv"), *args])
    assert again.exit_code == 0, again.output
    assert len(json.loads(again.stdout)["skipped"]) == 6


@pytest.mark.parametrize(
    ("make", "extra", "says"),
    [
        (lambda d: d.mkdir() or d, [], "is a folder"),  # read as "no such file"
        (lambda d: d, ["--prompts", "-3"], "--prompts -3: must be a positive count"),  # ignored before
        (lambda d: d, ["--lr", "-1e-4"], "--lr -0.0001: must be a finite number"),
    ],
)
def test_folders_and_negative_options_are_named_as_such(tmp_path, make, extra, says):
    log = tmp_path / "sweep.csv"
    if not extra:
        path = make(tmp_path / "adir")
    else:
        _write_sweep(log, np.random.default_rng(0))
        path = log
    out = CliRunner().invoke(
        app, ["import-logs", str(path), "--format", "csv", "-r", str(tmp_path / "r"), *extra]
    )
    assert out.exit_code == 2 and says in out.output, out.output


def test_a_negative_or_infinite_lr_in_the_log_is_refused(tmp_path):
    log = tmp_path / "lr.csv"
    log.write_text("step,prompts,group_size,lr,score\n1,8,8,-1e-6,0.1\n2,8,8,1e-6,0.2\n")
    out = CliRunner().invoke(app, ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r")])
    assert out.exit_code == 2 and "lr.csv:2: column 'lr': -1e-06 must be a finite number >= 0" in out.output
    log.write_text("step,prompts,group_size,lr,score\n1,8,8,1e-6,0.1\n2,8,8,0.0,0.2\n")  # decayed to 0
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    ok = CliRunner().invoke(app, args)
    assert ok.exit_code == 0, ok.output


def test_the_report_of_imported_runs_draws_their_learning_curves(tmp_path):
    """Learning curves were drawn by `probe` only: a report of imported logs had none."""
    runner = CliRunner()
    _import_sweep(tmp_path, "0.6")
    out = runner.invoke(app, ["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep")])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "rep" / "plots" / "learning_curves.png").is_file()
    assert "learning_curves.png" in (tmp_path / "rep" / "report.md").read_text()
    assert not (tmp_path / "r" / "plots" / "learning_curves.png").exists()  # the results stay as they were


def test_a_report_is_written_when_no_ranking_can_be_made(tmp_path):
    """A reference that never reached the target: report wrote nothing (exit 3), where its curves
    would show how far the runs got. It now writes the curves and the reason; recommend still exits 3."""
    runner = CliRunner()
    _import_sweep(tmp_path, "7")
    out = runner.invoke(app, ["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep")])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "No time-to-target ranking: the reference P4xG8 never reached score >= 7" in md
    assert (tmp_path / "rep" / "plots" / "learning_curves.png").is_file()
    assert runner.invoke(app, ["recommend", "--results", str(tmp_path / "r")]).exit_code == 3


def test_a_log_that_starts_mid_run_counts_its_first_entry_once(tmp_path):
    """A resumed run's log starting at step 501 charged its first entry's step time 501 times."""
    rows = ["run,prompts,group_size,lr,step,score,gen_s,train_s"]
    rows += [f"a,4,8,1e-4,{k},{0.1 * (k - 500)},1.5,0.5" for k in range(501, 511)]
    log = tmp_path / "resumed.csv"
    log.write_text("\n".join(rows) + "\n")
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    assert CliRunner().invoke(app, [*args, "--target", "0.6"]).exit_code == 0
    (run,) = ResultsStore(tmp_path / "r").runs()
    assert run.wall_s == pytest.approx(10 * 2.0)


def test_report_redraws_the_curves_of_runs_imported_since_the_last_report(tmp_path):
    import os

    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(0))
    lines = log.read_text().splitlines()
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("\n".join(ln for ln in lines if "-s1," not in ln) + "\n")
    second.write_text("\n".join([lines[0], *(ln for ln in lines if "-s1," in ln)]) + "\n")
    runner = CliRunner()
    res = tmp_path / "r"
    args = ["--format", "csv", "-r", str(res), "--metric", "score", "--target", "0.6"]
    assert runner.invoke(app, ["import-logs", str(first), *args]).exit_code == 0
    assert runner.invoke(app, ["report", str(res)]).exit_code == 0
    png = res / "plots" / "learning_curves.png"
    before = os.stat(png).st_mtime_ns
    assert runner.invoke(app, ["import-logs", str(second), *args]).exit_code == 0
    assert runner.invoke(app, ["report", str(res)]).exit_code == 0
    assert os.stat(png).st_mtime_ns > before


def test_an_untimed_evaluation_entry_does_not_pull_the_step_time_down(tmp_path):
    """TRL logs an evaluation at eval_steps in an entry of its own, without step_time: its zeros
    entered the per-step medians (5 of every 7 entries here: the median step time read 0)."""
    runner = CliRunner()
    for p in (4, 16):
        log = [
            {"step": k, "reward": min(1.0, 0.01 * k * p), "learning_rate": 1e-6, "step_time": 4.0}
            for k in range(5, 105, 5)
        ]
        log += [{"step": k, "eval_reward": 0.5} for k in range(1, 100, 2)]  # odd steps: never merged
        run = tmp_path / f"P{p}"
        run.mkdir()
        (run / "trainer_state.json").write_text(json.dumps({"global_step": 100, "log_history": log}))
        args = ["import-logs", str(run), "--format", "trl", "-r", str(tmp_path / "r"), "--prompts", str(p)]
        args += ["--group-size", "8", "--metric", "reward", "--target", "0.5"]
        assert runner.invoke(app, args).exit_code == 0
    out = runner.invoke(app, ["recommend", "--results", str(tmp_path / "r"), "--json"])
    assert out.exit_code == 0, out.output
    assert {c["train_s_per_step"] for c in json.loads(out.stdout)["candidates"]} == {4.0}
    # and the run's time counts each timed entry for the 5 steps it stands for, evaluations or not
    assert {r.wall_s for r in ResultsStore(tmp_path / "r").runs()} == {100 * 4.0}


def test_a_step_s_column_alone_is_a_throughput_source(tmp_path):
    """Issue 32 item 8: a log that times only the whole step (`step_s`, no gen_s/train_s) ranks by it;
    it used to be kept as a metric, and recommend had no throughput source."""
    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(0))
    lines = log.read_text().splitlines()
    rows = [ln.rsplit(",", 2)[0] for ln in lines]  # gen_s, train_s dropped
    step = [float(a) + float(b) for a, b in (ln.rsplit(",", 2)[1:] for ln in lines[1:])]
    body = [f"{r},{s:.4f}" for r, s in zip(rows[1:], step, strict=True)]
    log.write_text("\n".join([rows[0] + ",step_s", *body]) + "\n")
    runner = CliRunner()
    args = ["import-logs", str(log), "--format", "csv", "-r", str(tmp_path / "r"), "--metric", "score"]
    assert runner.invoke(app, [*args, "--target", "0.6"]).exit_code == 0
    out = runner.invoke(app, ["recommend", "--results", str(tmp_path / "r"), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["throughput_source"] == "timings from the imported logs"
    by = {c["name"]: c for c in data["candidates"]}
    n = 32
    assert by["P4xG8"]["responses_per_s"] == pytest.approx(n / (0.5 + 0.002 * n + 0.01 * n), rel=1e-3)
    assert data["recommended"]["prompts"] == 16  # as with the gen_s + train_s columns


def test_import_is_one_workflow_call_with_a_typed_outcome(tmp_path):
    """workflow.imports.import_logs takes the options as given: --metric/--target win over --set,
    and what was written comes back as an ImportOutcome (the CLI only renders it)."""
    from batchtune.errors import InputError
    from batchtune.integrations.common import RunInfo
    from batchtune.workflow.imports import ImportOutcome, import_logs

    log = tmp_path / "sweep.csv"
    _write_sweep(log, np.random.default_rng(0))
    sets = ["target.metric=reward", "target.value=0.9"]
    res = str(tmp_path / "r")
    out = import_logs([log], "csv", res, RunInfo(), metric="score", target=0.6, overrides=sets)
    assert isinstance(out, ImportOutcome) and len(out.added) == 6 and out.skipped == ()
    assert (out.recipe.target.metric, out.recipe.target.value) == ("score", 0.6)
    with pytest.raises(InputError, match="--staleness -1"):
        import_logs([log], "csv", str(tmp_path / "r2"), RunInfo(staleness=-1))
    assert not (tmp_path / "r2").exists()
