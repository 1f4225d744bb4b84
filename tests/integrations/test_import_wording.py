"""`recommend` and `report` on a directory of runs imported from trainer logs, with no probe of its
own: the text speaks of the imported runs, not of a probe that never ran."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.integrations.common import RunInfo
from tests.integrations.test_async_logs import _verl_log


def _import(tmp_path: Path, staleness: tuple[int, ...]) -> str:
    """verl logs at u = 4, two seeds each: P4xG8 and P16xG8 on-policy, and P4xG8-k1u4 where asked."""
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for p, k in [(4, 0), (16, 0), *((4, k) for k in staleness)]:
        for seed in (0, 1):
            path = tmp_path / f"p{p}k{k}s{seed}.jsonl"
            path.write_text(_verl_log(tmp_path, fully_async=k > 0).read_text())
            info = RunInfo(prompts=p, group_size=8, seed=seed, staleness=k, updates_per_batch=4)
            import_logs([path], "verl", res, info, metric="reward", target=0.3)
    return res


def _words(text: str) -> str:
    return " ".join(text.split())


def test_recommend_on_imported_runs_names_no_probe(tmp_path):
    """Before: "If it needs clearly more, the probe was too short or too noisy: add seeds and probe
    again", and "Probe cost: 1,600 samples, 40.0 s of run time; ... the probe cost 16.67x one full
    run": no probe ran, and the logs' runs were no cost of choosing. Now the confirm line says to
    import more seeds, and no probe cost is printed."""
    res = _import(tmp_path, ())
    out = CliRunner().invoke(app, ["recommend", "-r", res])
    assert out.exit_code == 0, out.output
    text = _words(out.output)
    assert "probe" not in text.lower(), text
    assert "If it needs clearly more, the imported runs were too few or too noisy: import more seeds" in text


def test_the_joint_decision_on_imported_runs_names_no_probe(tmp_path):
    """Before, with async runs imported beside the on-policy ones: "weight syncs from the probe's
    records", and on 8 GPUs "the probe's one device ran both sides ... the probe's weight-sync
    seconds". Now the imported runs' records, and their stage times taken as one device's."""
    res = _import(tmp_path, (1,))
    out = CliRunner().invoke(app, ["recommend", "-r", res, "--gpus", "8"])
    assert out.exit_code == 0, out.output
    text = _words(out.output)
    assert "probe" not in text.lower(), text
    assert "weight syncs from the imported runs' records" in text
    assert "the imported runs' weight-sync seconds" in text


def test_report_on_imported_runs_has_no_probe_cost(tmp_path):
    res = _import(tmp_path, ())
    out = CliRunner().invoke(app, ["report", res, "--out", str(tmp_path / "rep"), "--json"])
    assert out.exit_code == 0, out.output
    paths = json.loads(out.stdout)
    for page in (Path(paths["html"]).read_text(), Path(paths["markdown"]).read_text()):
        assert "Probe cost" not in page
        assert "probe was too short" not in _words(page)


def test_thin_evidence_from_imported_runs_asks_for_more_imported_seeds(tmp_path):
    """One seed per batch: "Weak evidence: P4xG8's R rests on one seed ... Before a long run: add
    seeds (budget.seeds); a branched probe: measure every batch ..." named a probe's settings; it
    now asks for more imported seeds."""
    from batchtune.workflow.imports import import_logs

    res = str(tmp_path / "res")
    for p in (4, 16):
        path = tmp_path / f"p{p}.jsonl"
        path.write_text(_verl_log(tmp_path, fully_async=False).read_text())
        info = RunInfo(prompts=p, group_size=8, updates_per_batch=4)
        import_logs([path], "verl", res, info, metric="reward", target=0.3)
    out = CliRunner().invoke(app, ["recommend", "-r", res])
    assert out.exit_code == 0, out.output
    text = _words(out.output)
    assert "rests on one seed" in text and "Before a long run: import more seeds" in text, text
    assert "probe" not in text.lower(), text
