"""Every trainer config batchtune emits, gathered for the tests that let the trainers judge them
(tests/integrations/test_packages_*.py, marker ``trainers``).

Three sources: ``emit`` over a spread of winners (GRPO and PPO, mini-batches, micro-batches, an
unknown LR, generation concurrency, vLLM's memory share, one to 16 GPUs over nodes of 8);
`batchtune recommend --emit T -o FILE` on the shipped evidence (the Hunyuan measurements and the NQM
example results); and a batch schedule, one config per stage plus each stage's resume settings.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from batchtune.cli import app
from batchtune.integrations.emit import emit
from batchtune.integrations.emit_base import RecommendationInput
from batchtune.integrations.emit_files import trainer_file
from batchtune.integrations.emit_schedule import emit_schedule
from tests.integrations.test_emit_schedule import _schedule

ROOT = Path(__file__).resolve().parents[2]
HUNYUAN = ROOT / "recipes" / "hunyuan-grpo-measurements.toml"
NQM_EVIDENCE = ROOT / "examples" / "ci" / "evidence" / "nqm"
EXAMPLES = ROOT / "examples" / "ci"

# (label, winner, GPUs, emitter options); trainers that cannot express one (TRL: PPO) skip it
WINNERS: list[tuple[str, RecommendationInput, int, dict]] = [
    ("grpo-1gpu", RecommendationInput(16, 8, 5.66e-4), 1, {}),
    (
        "grpo-8gpu-micro",
        RecommendationInput(
            128,
            8,
            1.4e-6,
            mini_batches=2,
            micro_batch_per_gpu=4,
            generation_concurrency=64,
            gpu_memory_utilization=0.6,
        ),
        8,
        {},
    ),  # fmt: skip
    ("grpo-no-lr", RecommendationInput(64, 8, float("nan")), 8, {}),
    ("grpo-16gpu-nodes", RecommendationInput(1024, 8, 1.4e-6), 16, {"gpus_per_node": 8}),
    (
        "ppo-16gpu",
        RecommendationInput(
            64,
            4,
            1e-6,
            algorithm="ppo",
            critic_lr=1e-5,
            mini_batches=2,
            generation_concurrency=128,
            gpu_memory_utilization=0.5,
        ),
        16,
        {"gpus_per_node": 8},
    ),  # fmt: skip
    ("ppo-critic-mini", RecommendationInput(64, 4, 1e-6, algorithm="ppo", critic_mini_batches=4), 8, {}),
]


@dataclass(frozen=True)
class Emitted:
    """One emitted config: ``text`` as printed (or a file's contents), ``values`` by the trainer's
    names (None for a schedule stage, whose values are its text's)."""

    label: str
    text: str
    values: dict[str, object] | None
    options: dict


def from_emit(trainer: str) -> list[Emitted]:
    out = []
    for label, rec, gpus, options in WINNERS:
        opts = dict(options)
        if trainer == "trl" and rec.algorithm == "ppo":
            continue
        if trainer == "openrlhf" and rec.critic_mini_batches:
            continue  # one --train.batch_size for both: the emitter refuses it (tested in test_emit)
        for legacy in (False, True) if trainer == "openrlhf" else (False,):
            if legacy:
                opts["legacy_flags"] = True
            e = emit(trainer, rec, gpus, **opts)
            name = f"{label}{'-legacy' if legacy else ''}"
            out.append(Emitted(name, e.text, e.values, dict(opts)))
            out.append(Emitted(f"{name}-file", trainer_file(trainer, e.values, e.text), e.values, dict(opts)))
    return out


def from_recommend(trainer: str, tmp: Path) -> list[Emitted]:
    """`recommend --emit TRAINER -o FILE --json` on the shipped evidence: the printed text and the file."""
    import json
    import shutil

    runner = CliRunner()
    out = []
    evidence = tmp / "nqm-evidence"  # a copy: recommend writes its plots beside the results
    if not evidence.exists():
        shutil.copytree(NQM_EVIDENCE, evidence)
    for label, args in (
        ("hunyuan", ["--measurements", str(HUNYUAN), "--gpus", "16"]),
        ("nqm", ["--results", str(evidence), "--gpus", "8"]),
    ):
        path = tmp / f"{label}-{trainer}.out"
        res = runner.invoke(app, ["recommend", *args, "--emit", trainer, "-o", str(path), "--json"])
        assert res.exit_code == 0, res.output
        emitted = json.loads(res.output)["emitted"]
        out.append(Emitted(f"recommend-{label}", emitted["text"], emitted["values"], {}))
        out.append(Emitted(f"recommend-{label}-file", path.read_text(), emitted["values"], {}))
    return out


def from_schedule(trainer: str) -> list[Emitted]:
    """Each stage of a 3+ stage schedule as its own text (the stage's config and resume line)."""
    out = []
    for algo in ("grpo", "ppo") if trainer == "verl" else ("grpo",):
        base = RecommendationInput(8, 8, 1e-6, algorithm=algo)
        for legacy in (False, True) if trainer == "openrlhf" else (False,):
            opts = {"legacy_flags": True} if legacy else {}
            text = emit_schedule(trainer, _schedule(), base, num_gpus=8, **opts)
            stages = text.split("# ---- stage ")[1:]
            assert len(stages) > 2, text
            for i, stage in enumerate(stages, 1):
                name = f"schedule-{algo}{'-legacy' if legacy else ''}-stage{i}"
                out.append(Emitted(name, "# ---- stage " + stage, None, opts))
    return out


def all_emitted(trainer: str, tmp: Path) -> list[Emitted]:
    return from_emit(trainer) + from_recommend(trainer, tmp) + from_schedule(trainer)


# ---- reading the emitted text back as the trainer's command line -------------------------------

_PLACEHOLDER = re.compile(r"<[^>]*>")


def command_words(text: str) -> list[str]:
    """The words of a command as a shell reads it: comments dropped, continuations joined, the
    ``...`` the user fills in and ``"$@"`` removed (for a Python text: none)."""
    skip = ("#", "set -", "GRPOConfig")
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(skip))
    words = shlex.split(body.replace("\\\n", " "), comments=True)
    return [w for w in words if w not in ("...", "$@")]


def resume_words(text: str) -> list[str]:
    """The settings of a schedule stage's ``# resume:`` line, placeholders as a checkpoint path."""
    for line in text.splitlines():
        if line.startswith("# resume: "):
            note = _PLACEHOLDER.sub("/ckpt/stage", line[len("# resume: ") :])
            return note.split("  (")[0].split(" (")[0].split()
    return []
