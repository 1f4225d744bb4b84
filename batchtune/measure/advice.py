"""Why `recommend` could not rank, in the words of what the results directory holds."""

from __future__ import annotations

import math
from typing import Any

from batchtune.measure.plan import run_id
from batchtune.measure.rl_refine import stored_plan
from batchtune.recipe.schema import Recipe
from batchtune.records.store import ResultsStore


def why_not_ranked(message: str, store: ResultsStore, cfg: Recipe, eff: Any) -> str:
    """``message``, told what the results directory says: runs that stopped at the probe's own
    target (budget.stop_at_target) cannot reach a target past it, and an unfinished probe is
    finished by rerunning it; 'run longer' and 'fewer than two candidates' alone misled."""
    runs = store.runs()
    if runs and all(r.imported for r in runs):  # no probe made these: none to rerun
        return (
            f"{message} (the runs here were imported from logs: import more runs or seeds, or set a "
            "target they reach with --set target.value=X)"
        )
    manifest = store.read_manifest() or {}
    recipe_table = manifest.get("recipe")
    probed: dict[str, Any] = recipe_table if isinstance(recipe_table, dict) else {}
    target, budget = probed.get("target", {}), probed.get("budget", {})
    t = cfg.target
    ref = eff.get(eff.reference).estimate
    old = target.get("value", t.value) if isinstance(target, dict) else t.value
    beyond = isinstance(old, int | float) and (t.value > old if t.higher_is_better else t.value < old)
    stopped = [r.status == "reached_target" for r in runs if r.candidate == eff.reference]
    if (
        isinstance(target, dict)
        and isinstance(budget, dict)
        and budget.get("stop_at_target", True)
        and target.get("metric", t.metric) == t.metric
        and beyond
        and stopped
        and all(stopped)
        and (ref is None or not math.isfinite(ref.samples_to_target))
    ):
        cmp = ">=" if t.higher_is_better else "<="
        return (
            f"the reference {eff.reference} never reached {t.metric} {cmp} {t.value:g}: the probe's runs "
            f"stopped at its own target ({t.metric} {cmp} {target.get('value')}, budget.stop_at_target). "
            f"A target past it needs a probe made with it, into another results directory: "
            f"batchtune probe RECIPE --set target.value={t.value:g} --results NEW_DIR"
        )
    try:
        plan = stored_plan(cfg, store)  # with the candidates refinement rounds added
    except Exception:  # noqa: BLE001 - the advice is best effort; the error stands as it is
        return message
    planned = [run_id(c, s) for c in plan.candidates for s in cfg.budget.seeds]
    done = sum(store.is_finished(r) for r in planned)
    if done < len(planned):
        return (
            f"{message}: the probe is unfinished ({done} of {len(planned)} planned runs finished); "
            "rerun the same `batchtune probe` command to finish it"
        )
    return message
