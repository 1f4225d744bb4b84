"""`--emit TRAINER --out FILE`: the winner as a file the trainer takes as it is.

- verl: a Hydra override file, one ``key=value`` per line, for
  ``python3 -m verl.trainer.main_ppo $(grep -v '^#' FILE) <model, data, reward overrides>``
- TRL: a ``GRPOConfig`` YAML (``GRPOConfig(**yaml.safe_load(open(FILE)))``, or
  ``trl grpo --config FILE``)
- OpenRLHF: an executable launch script; extra flags are passed through (``bash FILE --pretrain ...``)

Notes and caveats travel as ``#`` comments, valid in all three formats.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from batchtune.errors import InputError
from batchtune.records.files import atomic_write_text


def sig3(x: float) -> float:
    """``x`` to 3 significant digits (LRs: 5.66e-4, not 0.000565685424949238); NaN and 0 kept."""
    return float(f"{x:.3g}") if math.isfinite(x) and x != 0 else x


def notes_of(text: str) -> list[str]:
    """The notes an emitter appended to its text as ``# `` lines (emit_base.commented)."""
    return [ln[2:] for ln in text.splitlines() if ln.startswith("# ") and not ln.startswith("# CLI:")]


def hardware_caveat(profile_hardware: str, concurrency: int, known_gpus: tuple[str, ...]) -> str:
    """A caveat for a generation concurrency measured on other hardware than the trainer's."""
    where = profile_hardware or "this machine"
    text = (
        f"caveat: the generation concurrency {concurrency} was measured on {where}; it holds for the "
        "same hardware, model and lengths only: rerun `batchtune profile-gen` on the trainer's GPUs"
    )
    if not any(g.split("-")[0].lower() in where.lower() for g in known_gpus):
        text += " (measured off-GPU: do not use it for a GPU job as it is)"
    return text


def _comments(lines: list[str]) -> str:
    return "".join(f"# {ln}\n" for ln in lines)


def trainer_file(trainer: str, values: dict[str, object], text: str) -> str:
    """The file contents for ``trainer`` from an emitter's ``values`` and ``text`` (for its notes).
    A pre-training framework's (emit_pretrain.py: flags and stage commands) is its text as it is."""
    from batchtune.integrations.emit_pretrain import PRETRAIN_TRAINERS

    if trainer in PRETRAIN_TRAINERS:
        return text
    notes = notes_of(text)
    if trainer == "verl":
        first = text.split("\n", 1)[0].split()  # python3 -m MODULE \ (an async pick: another module)
        module = first[2] if first[:2] == ["python3", "-m"] and len(first) > 2 else "verl.trainer.main_ppo"
        head = [
            "batchtune: verl (Hydra) overrides for the recommended configuration, one per line",
            f"use: python3 -m {module} $(grep -v '^#' THIS_FILE) <model, data, reward overrides>",
        ]
        body = "".join(f"{k}={_scalar(v)}\n" for k, v in values.items())
        return _comments(head + notes) + body
    if trainer == "trl":
        import yaml

        head = [
            "batchtune: TRL GRPOConfig for the recommended configuration",
            "use: GRPOConfig(**yaml.safe_load(open(THIS_FILE))), or trl grpo --config THIS_FILE",
        ]
        if "AsyncGRPOConfig(" in text:
            head = [
                "batchtune: TRL AsyncGRPOConfig (trl.experimental.async_grpo) for the recommended "
                "configuration",
                "use: AsyncGRPOConfig(**yaml.safe_load(open(THIS_FILE)))",
            ]
        return _comments(head + notes) + yaml.safe_dump(dict(values), sort_keys=False)
    if trainer == "openrlhf":
        flags = "".join(
            f"    {k} {_scalar(v)} \\\n" if v is not True else f"    {k} \\\n" for k, v in values.items()
        )
        return (
            "#!/usr/bin/env bash\n"
            + _comments(["batchtune: OpenRLHF launch for the recommended configuration", *notes])
            + "# use: bash THIS_FILE --pretrain MODEL --prompt_data DATA ... (passed through)\n"
            + "set -euo pipefail\n"
            + "python3 -m openrlhf.cli.train_ppo_ray \\\n"
            + flags
            + '    "$@"\n'
        )
    raise InputError(f"unknown trainer {trainer!r}; choose verl, trl or openrlhf")


def _scalar(v: object) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def write_trainer_file(trainer: str, values: dict[str, object], text: str, out: Path) -> Path:
    """Write the file atomically; the OpenRLHF script is made executable."""
    out = Path(out)
    if out.parent and not out.parent.exists():
        raise InputError(f"--out {out}: folder {out.parent} does not exist")
    atomic_write_text(out, trainer_file(trainer, values, text))  # a full disk names the file
    if trainer == "openrlhf":
        os.chmod(out, 0o755)
    return out
