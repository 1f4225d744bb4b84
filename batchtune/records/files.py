"""The file primitives of a results directory: atomic writes, JSON lines, locks, named write errors."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from batchtune import codec
from batchtune.errors import InputError


def to_json(record: Any) -> str:
    """One record as one line of JSON (the codec's NaN/inf convention)."""
    return codec.dumps(record, sort_keys=True)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """A write's OSError names ``path``: EFBIG (file-size limit) and ENOSPC (disk full) raised by a
    file object's write or flush carry no filename, and the CLI's one-line message shows it."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half of one."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``: readers (and a
    later run) see the old file or the new one, never a truncated one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # named as the file asked for (a read-only folder, a directory in its place)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_if_changed(path: Path, text: str) -> None:
    """``atomic_write_text`` unless ``path`` holds ``text`` already (a rerun that changes nothing
    writes nothing, so it also runs in a read-only directory)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text(encoding="utf-8") == text:
            return
    atomic_write_text(path, text)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read JSON lines; a torn last line (a crash mid-write) is skipped, any other bad line is an error."""
    if not path.exists():
        return []
    lines = read_text(path).splitlines()
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(codec.loads(line, f"{path}:{i + 1}"))
        except InputError:
            if i == len(lines) - 1:
                break
            raise InputError(f"{path}:{i + 1} is not valid JSON") from None
    return rows


@contextlib.contextmanager
def locked_waiting(paths: Path | Sequence[Path], on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold the lock of each of ``paths`` in the order given, waiting for each (every holder of two
    takes them in one order, so none waits for another that waits for it); ``on_wait()`` is called
    once first where another process holds one (to say why this one stops)."""
    said: list[bool] = []

    def wait_once() -> None:
        if not said:
            said.append(True)
            on_wait()

    with contextlib.ExitStack() as stack:
        for path in [paths] if isinstance(paths, Path) else paths:
            stack.enter_context(_locked_waiting(path, wait_once))
        yield


@contextlib.contextmanager
def _locked_waiting(path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    with locked(path, blocking=False) as got:
        if got:
            yield
            return
    on_wait()
    with locked(path):
        yield


@contextlib.contextmanager
def locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if missing); yields False if ``blocking`` is off and
    another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(path)
    if fd is None:
        yield True  # no lock file, and none can be made: nothing of ours to exclude (see _open_lock)
        return
    try:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int | None:
    """A descriptor to flock ``path`` with: read-write (created if missing), else, where this user or
    file system may not write (EACCES, EROFS: a finished probe rerun on a read-only results directory),
    read-only on the existing file (flock does not need write access); None where it does not exist
    and cannot be made: this process cannot write in that directory either, so it goes on unlocked."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EROFS):
            raise
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
