"""Reading a checkpoint file from a results directory without running code (issue 33).

A results directory may sit on shared storage that others can write to, so a checkpoint holds only
tensors and plain containers (dicts, lists, numbers, strings: RNG states as byte tensors or
numpy's state dict, optimiser state_dicts) and is read with ``torch.load(weights_only=True)``,
whose unpickler builds nothing else: a planted file whose pickle calls a function (``__reduce__``)
is refused before anything in it runs, and the probe stops (UnsafeCheckpoint, exit 2): the runs to
start from it are not sealed as failed, which would read as the batch failing. A file that cannot
be read at all (missing, truncated) fails the run with its path.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from batchtune.backends.spec import RunFailed
from batchtune.errors import UnsafeCheckpoint

_FRESH = "Probe into a fresh results_dir (and check who can write to this one)"


def _refusal(file: Path, message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    # torch names what it refused on a line of its own ("... unsupported GLOBAL posix.system ...")
    what = next((line for line in lines if "GLOBAL" in line), None)
    if what is None:  # not a pickle at all (truncated, overwritten): say what the unpickler met
        detail = next((line for line in lines if line.startswith("Unsupported")), lines[-1] if lines else "")
        return f"cannot read the checkpoint {file}: not a checkpoint file ({detail[:160]})"
    return (
        f"refused the checkpoint {file}: it holds more than tensors and plain containers, a pickle "
        f"that could run code ({what[:160]}); nothing in it ran. {_FRESH}"
    )


def read_state(file: Path) -> dict[str, Any]:
    """The state dict saved at ``file``, on the CPU (RNG states must stay CPU byte tensors)."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        why = _refusal(file, str(exc))
        if why.startswith("refused"):  # a pickle that names code: someone else's file, not a run's
            raise UnsafeCheckpoint(why) from None
        raise RunFailed("failed", why) from None
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise RunFailed("failed", f"cannot read the checkpoint {file}: {exc}") from None
    if not isinstance(state, dict):
        raise UnsafeCheckpoint(f"refused the checkpoint {file}: not a state dict batchtune wrote. {_FRESH}")
    return state
