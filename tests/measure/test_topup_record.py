"""The async probe's seed top-up record (measure/topup_record.py): a damaged ``async_topup.json`` is
refused on load, in one line naming the file and the field (exit 2), never read as a silently
different record: the probe runs its rounds and `recommend` writes its notes from it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.errors import InputError
from batchtune.measure.topup_record import TOP_UP_FILE, load_top_up
from batchtune.records.store import ResultsStore
from tests.measure.test_async_topup import SEQ, _probe


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in async probe's results with sequential rounds and an end (a few seconds)."""
    root = tmp_path_factory.mktemp("topup") / "r"
    _probe(root, SEQ)
    rec = load_top_up(ResultsStore(root))
    assert rec is not None and len(rec.rounds) >= 2 and rec.end is not None
    return root


def _set(*path: str | int, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        at: Any = data
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value

    return edit


# each was loaded as is before: a round of an unknown kind read as a contenders round, a null margin
# as NaN ("nan%" in recommend's notes), a negative cap or seed count, a label no candidate has ...
BOGUS = {
    "kind": (_set("rounds", 0, "kind", value="bogus"), "rounds[0].kind = 'bogus' is not one of"),
    "null margin": (_set("margin", value=None), "margin = None is not a number in [0, 10]"),
    "negative cap": (_set("cap", value=-3), "cap = -3 is not a whole number in [0, 1000]"),
    "top as text": (_set("top", value="4"), "top = '4' is not a whole number in [1, 1000]"),
    "negative seeds": (_set("rounds", 1, "seeds", value=-4), "rounds[1].seeds = -4 is not a whole number"),
    "negative seeds before": (
        _set("rounds", 0, "topped", 0, "seeds_before", value=-1),
        "rounds[0].topped[0].seeds_before = -1 is not a whole number >= 0",
    ),
    "unknown label": (
        _set("rounds", 0, "topped", 0, "label", value="bogus"),
        "rounds[0].topped[0].label = 'bogus' is not a probe candidate's name",
    ),
    "best not a name": (_set("end", "best", value=7), "end.best = 7 is not a probe candidate's name"),
    "nothing topped": (_set("rounds", 0, "topped", value=[]), "rounds[0].topped is empty"),
    "negative end seeds": (_set("end", "seeds", value=-2), "end.seeds = -2 is not a whole number"),
    "tolerance past 1": (_set("end", "tol", value=2.0), "end.tol = 2.0 is not a number in (0, 1)"),
    "negative T": (_set("rounds", 0, "best_t", value=-5.0), "rounds[0].best_t = -5.0 is not a number >= 0"),
}


@pytest.mark.parametrize("case", list(BOGUS))
def test_a_record_with_a_bogus_field_is_refused_naming_the_file_and_field(
    finished: Path, tmp_path: Path, case: str
) -> None:
    root = tmp_path / "r"
    shutil.copytree(finished, root)
    path = root / TOP_UP_FILE
    data = json.loads(path.read_text())
    edit, said = BOGUS[case]
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_top_up(ResultsStore(root))
    msg = str(err.value)
    assert msg.startswith(f"{path} is not a seed top-up record ({said}") and "delete it" in msg, msg
    assert "\n" not in msg


def test_recommend_and_probe_refuse_a_bogus_record_in_one_line_exit_2(finished: Path, tmp_path: Path) -> None:
    from batchtune.measure.async_topup import add_async_seeds
    from batchtune.measure.plan import plan_candidates
    from batchtune.measure.probe import analyse_store
    from batchtune.measure.stop_rule import NO_BAND, stop_policy
    from tests.measure.test_async_topup import _cfg

    root = tmp_path / "r"
    shutil.copytree(finished, root)
    path = root / TOP_UP_FILE
    data = json.loads(path.read_text())
    data["rounds"][0]["kind"] = "bogus"
    path.write_text(json.dumps(data))
    out = CliRunner().invoke(app, ["recommend", "-r", str(root), "--throughput", "probe"], terminal_width=400)
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output and str(path) in out.output and "rounds[0].kind" in out.output
    cfg = _cfg(root, SEQ)
    policy = lambda: stop_policy(cfg, NO_BAND)  # noqa: E731
    with pytest.raises(InputError, match="rounds\\[0\\].kind = 'bogus'"):  # before any run of a round
        add_async_seeds(
            cfg, ResultsStore(root), plan_candidates(cfg), lambda *a, **k: None, analyse_store, policy
        )


def _old_format(path: Path) -> None:
    """Rewrite a record as the probe wrote it before the sequential rounds (ed6fcfc): no cap, no
    end, rounds without their seed count and kind, topped candidates without ratio and low."""
    data = json.loads(path.read_text())
    for r in data["rounds"]:
        assert r["kind"] == "contenders" and r["seeds"] == data["top"]
        del r["kind"], r["seeds"]
        for t in r["topped"]:
            del t["ratio"], t["low"]
    del data["cap"], data["end"]
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize("cap", [0, 3])  # the recipe's budget.async_top_up_max_seeds: <= top, none
def test_a_finished_probe_with_a_record_from_before_the_cap_rewrites_nothing(
    tmp_path: Path, cap: int
) -> None:
    """A record written before the cap field existed (no sequential rounds then) was read with cap =
    top, which no recipe matched, so the first probe run again started it afresh: it rewrote the
    record with its rounds gone ('no candidate needed more seeds' in recommend), and failed in a
    read-only directory. Read as it was meant (no sequential rounds, as any cap <= top), it is kept
    and nothing is written."""
    fixed = ("budget.async_top_up_margin=0.1", f"budget.async_top_up_max_seeds={cap}")
    root = tmp_path / "r"
    _probe(root, fixed)
    path = root / TOP_UP_FILE
    _old_format(path)
    old, before = load_top_up(ResultsStore(root)), path.stat()
    assert old is not None and old.rounds and old.end is None
    _, store, ran, n = _probe(root, fixed)
    after = path.stat()
    assert (ran, n) == ([], 0)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), (
        "the record was rewritten"
    )
    assert load_top_up(store) == old
    out = CliRunner().invoke(app, ["recommend", "-r", str(root), "--throughput", "probe", "--json"])
    assert out.exit_code == 0, out.output
    notes = json.loads(out.stdout)["async_decision"]["notes"]
    assert any(n.startswith("round 1: ") for n in notes) and not any(
        "no candidate needed" in n for n in notes
    )


def test_recommend_names_no_candidate_it_does_not_rank_in_the_top_up_notes(
    finished: Path, tmp_path: Path
) -> None:
    """A candidate the recipe dropped after the rounds topped it up (its runs deleted) is not ranked,
    and the top-up's estimates leave it out (6f34f19); `recommend`'s notes still named it in each
    recorded round, and an end that named it kept its bound and near tie. The rounds now show the
    ranked candidates only, say how many were left out, and such an end is dropped."""
    root = tmp_path / "r"
    shutil.copytree(finished, root)
    rec = load_top_up(ResultsStore(root))
    assert rec is not None and rec.end is not None
    gone = next(t.label for r in rec.rounds for t in r.topped if t.label != rec.end.best)
    assert any(r.best == gone for r in rec.rounds)  # a round whose best estimate it was
    for run in (root / "runs").glob(f"{gone}-s*"):
        shutil.rmtree(run)
    argv = ["recommend", "-r", str(root), "--throughput", "probe", "--json"]

    def decision() -> dict[str, Any]:
        out = CliRunner().invoke(app, argv)
        assert out.exit_code == 0, out.output
        d = json.loads(out.stdout)["async_decision"]
        assert gone not in {c["name"] for c in d["candidates"]}
        return d

    d = decision()
    notes = [n for n in d["notes"] if "top-up" in n or n.startswith("round ") or "not ranked" in n]
    assert not [n for n in notes if gone in n], notes
    assert any(n.startswith("round ") and "best estimate (a candidate not ranked here)" in n for n in notes)
    assert any(n.startswith("1 candidate(s) these rounds topped up are not ranked here") for n in notes)
    assert d["top_up_end"]["best"] == rec.end.best  # an end that names only ranked candidates is kept
    # an end that named it open at the cap: its bound and near tie are not of this ranking
    path = root / TOP_UP_FILE
    data = json.loads(path.read_text())
    data["end"]["open"] = [{"label": gone, "ratio": 1.01, "low": 0.8, "seeds": 16}]
    path.write_text(json.dumps(data))
    d = decision()
    assert d["top_up_end"] is None and not [n for n in d["notes"] if gone in n or "NOT RESOLVED" in n]
    assert any("so is where the rounds ended" in n for n in d["notes"])


def test_a_candidate_the_recipe_dropped_is_not_ranked_from_its_kept_runs(
    finished: Path, tmp_path: Path
) -> None:
    """A probe resumed with a recipe edited to drop a candidate (here probe.staleness without k = 1)
    keeps its runs in the directory; the top-up compares the recipe's candidates only (6f34f19), but
    `recommend` ranked the dropped ones from their kept runs (the plan was not used once a run fell
    outside it) and picked one. The probe's runs of a dropped candidate are now left out, by the
    probe's analysis and `recommend` alike, in one note; runs imported from logs are ranked still."""
    from batchtune.measure.plan import plan_candidates
    from batchtune.measure.probe import analyse_store
    from tests.measure.test_async_topup import _cfg

    root = tmp_path / "r"
    shutil.copytree(finished, root)
    edit = "probe.staleness=[0, 2]"

    def recommended(*sets: str) -> dict[str, Any]:
        argv = ["recommend", "-r", str(root), "--throughput", "probe", "--json"]
        out = CliRunner().invoke(app, [*argv, *(a for s in sets for a in ("--set", s))])
        assert out.exit_code == 0, out.output
        return dict(json.loads(out.stdout))

    whole = recommended()
    pick = whole["recommended"]["name"]
    assert "-k1u" in pick  # the whole probe picks a k = 1 candidate: the edit drops it
    d = recommended(edit)
    ranked = {c["name"] for c in d["candidates"]}
    assert not [lab for lab in ranked if "-k1u" in lab], ranked
    assert {c["name"] for c in d["async_decision"]["candidates"]} == ranked
    assert "-k1u" not in d["recommended"]["name"]
    said = [n for n in d["notes"] if n.startswith("left out ")]
    assert len(said) == 1 and pick in said[0], d["notes"]
    assert said[0].endswith("not in the recipe's candidates; re-add them to rank them")
    cfg = _cfg(root, ("budget.async_top_up_max_seeds=16", "budget.async_top_up_margin=0.3", edit))
    probe_eff = analyse_store(ResultsStore(root), cfg, plan_candidates(cfg))  # the resumed probe's
    assert {c.label for c in probe_eff.candidates} == ranked and said[0] in probe_eff.notes
    # runs imported from logs are ranked wherever they fall, as before
    for path in (root / "runs").glob(f"{pick}-s*/run.json"):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "source": "imported.jsonl"}))
    d = recommended(edit)
    assert pick in {c["name"] for c in d["candidates"]}
    assert not [n for n in d["notes"] if n.startswith("left out ") and pick in n], d["notes"]


def test_the_top_up_notes_give_no_cause_for_an_unranked_candidate_that_is_not_so(tmp_path: Path) -> None:
    """A candidate the rounds topped up can be left out of the ranking with its runs all there:
    `recommend --set algorithm.sync_every=3` rules out k = 1 (as another group size at the same B, k
    and u would). The notes said it was "dropped from the recipe with no runs left, or their runs
    deleted", and that `batchtune probe` again finds where the rounds ended: neither was so. They
    now count it without a cause, and say "no runs" only of a candidate that has none here."""
    from tests.test_async_recommend import ASYNC_RUNS, _store

    root = _store(tmp_path / "r", [], dict(ASYNC_RUNS))
    topped = {"label": "P2xG8-k1u1", "t": 11.0, "seeds_before": 2}
    rnd = {"best": "P4xG8-k1u1", "best_t": 10.0, "seeds": 4, "kind": "contenders", "topped": [topped]}
    end = {"best": "P4xG8-k1u1", "seeds": 4, "open": [], "tol": 0.05, "compared": 1, "cap": 8}
    record = {"margin": 0.3, "top": 4, "cap": 8, "times_source": "probe step times", "rounds": [rnd]}
    (root / TOP_UP_FILE).write_text(json.dumps({**record, "end": end}))

    def left_out(*argv: str) -> list[str]:
        argv = ("recommend", "-r", str(root), "--throughput", "probe", "--json", *argv)
        out = CliRunner().invoke(app, list(argv))
        assert out.exit_code == 0, out.output
        d = json.loads(out.stdout)["async_decision"]
        assert "P2xG8-k1u1" not in {c["name"] for c in d["candidates"]}
        return [n for n in d["notes"] if "not ranked here" in n and not n.startswith("round ")]

    assert left_out("--set", "algorithm.sync_every=3") == [
        "1 candidate(s) these rounds topped up are not ranked here, so the notes leave them out; so is "
        "where the rounds ended, which named one"
    ]
    for run in (root / "runs").glob("P2xG8-k1u1-s*"):
        shutil.rmtree(run)
    (root / TOP_UP_FILE).write_text(json.dumps({**record, "end": None}))
    assert left_out() == [
        "1 candidate(s) these rounds topped up are not ranked here (1 with no runs in this directory), "
        "so the notes leave them out"
    ]
