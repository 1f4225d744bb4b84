"""Paths inside a results directory stay inside it (issue 33).

A results directory may sit on shared storage others can write to. A run folder, ``runs/`` or a
checkpoint folder replaced by a symbolic link that points elsewhere would make a probe rename and
write files outside the directory (someone else's). Every path the store writes through is
resolved, links followed, and refused unless it lands under the resolved results directory (which
may itself be a link: a results directory on a mounted volume is fine).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from batchtune.errors import InputError


def contained(root: Path, path: Path, files: Iterable[str] = ()) -> Path:
    """``path`` (and ``path / name`` for each of ``files``) if it resolves inside ``root``;
    an InputError naming the link otherwise. Returns ``path``."""
    real_root = root.resolve()
    for p in (path, *(path / name for name in files)):
        real = p.resolve()
        if real != real_root and real_root not in real.parents:
            raise InputError(
                f"{p} leaves the results directory {root} through a symbolic link (to {real}); "
                "remove the link (nothing was written outside)"
            )
    return path
