"""`tune` is one workflow call: workflow.tune runs probe, profile-gen and recommend, telling a display
as each stage starts and ends; the CLI only draws."""

from __future__ import annotations

import contextlib

from batchtune.workflow import load
from batchtune.workflow.tune import Tuned, tune

SMALL = ["nqm.dim=200", "candidates.prompts=[1, 4]", "budget.seeds=[0, 1]", "run.workers=1"]


class _Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def probing(self):  # type: ignore[no-untyped-def]
        self.seen.append("probing")
        return contextlib.nullcontext(None)

    def probed(self, result) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(f"probed {type(result).__name__}")

    def profiling(self):  # type: ignore[no-untyped-def]
        self.seen.append("profiling")
        return contextlib.nullcontext(None)

    def profiled(self, result, plots) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(f"profiled {type(result).__name__}")


def test_tune_runs_the_stages_in_order_and_returns_them_typed(tmp_path) -> None:
    cfg = load("nqm", SMALL, str(tmp_path / "r"))
    shown = _Recorder()
    out = tune(cfg, shown, emit="verl", gpus=8, gpus_per_node=8)
    assert shown.seen == ["probing", "probed ProbeResult", "profiling", "profiled ProfileResult"]
    assert isinstance(out, Tuned) and out.profile is not None
    assert out.recommendation.winner.label in {c.label for c in out.probe.efficiency.candidates}
    assert out.emitted is not None and "train_batch_size" in out.emitted
    assert out.stated_run == (0, cfg.probe_choice) and "no full run stated" in cfg.probe_choice
