"""Atomic file writes: a temporary file in the same folder, flushed and renamed over the target (layer L0).

A process killed mid-write leaves the previous file (or none) and a hidden temporary file, never a half-written
target. Used for the selection file, the report, the plot and the model card.
"""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from typing import IO, Iterator


def temporary_pattern(path: str | os.PathLike) -> str:
    """Glob pattern of the temporary files `atomic_open(path)` creates (to clean up after a killed write)."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(glob.escape(folder), f".{glob.escape(name)}.*.tmp")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; on a clean exit it is fsynced, made world-readable (0644) and
    renamed to `path`; on an exception it is removed and `path` is left as it was.

    Args:
        path (`str` or `os.PathLike`): the file to (re)write; its folder is created if missing.
        mode (`str`, *optional*, defaults to `"w"`): `"w"` (UTF-8 text) or `"wb"`.
    Yields:
        The open file object.
    Raises:
        ValueError: if `mode` is not `"w"` or `"wb"`.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb', got {mode!r}.")
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
