"""Sequential seeding on the NQM: an inconclusive batch gets paired extra seeds until it decides."""

from __future__ import annotations

from pathlib import Path

from batchtune.measure.probe import run_probe
from batchtune.recipe.load import load_recipe
from batchtune.report.json import efficiency_to_dict

ROOT = Path(__file__).resolve().parents[2]
# N = 32 (reference) and 512 (true R/R0 ~1.7 near the stability edge): with seeds 0, 1 and no band
# the 512 interval straddles 1.1 (inconclusive); paired extra seeds decide it.
CASE = [
    "budget.seeds=[0,1]",
    "candidates.prompts=[4,64]",
    "run.workers=1",
    "budget.stop_outside_band=false",
]


def test_inconclusive_batch_gets_paired_seeds_until_it_decides(tmp_path):
    recipe = load_recipe(ROOT / "recipes" / "nqm.toml", [*CASE, "budget.max_extra_seeds=0"])
    before = run_probe(recipe, tmp_path / "r").efficiency
    assert before.get("P64xG8").status == "inconclusive", before.get("P64xG8").verdict
    assert before.extra_seeds == {}

    recipe = load_recipe(ROOT / "recipes" / "nqm.toml", [*CASE, "budget.max_extra_seeds=3"])
    result = run_probe(recipe, tmp_path / "r")  # resumes: only the extra seeds run
    eff = result.efficiency
    extra = eff.extra_seeds
    assert result.runs_done == 2 * extra["P64xG8"]
    assert 1 <= extra["P64xG8"] <= 3 and extra["P4xG8"] == extra["P64xG8"]  # paired with the reference
    cand = eff.get("P64xG8")
    assert cand.estimate is not None and cand.estimate.seed_ids == eff.get("P4xG8").estimate.seed_ids
    assert cand.status == "deviates" or extra["P64xG8"] == 3, cand.verdict
    data = efficiency_to_dict(eff)
    assert {c["name"]: c["extra_seeds"] for c in data["candidates"]} == extra
    assert any(n.startswith("sequential seeding") for n in data["notes"])
    assert run_probe(recipe, tmp_path / "r").runs_done == 0  # a rerun replays the same rounds
