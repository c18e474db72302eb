"""Writing a run's files so that a crash, a kill or a full disk never leaves half of one.

Every output (a checkpoint, `policy.pt`, the reports and plots) is written to a temporary file
of a name no one else picks, in the target's own folder (so the rename stays on one file
system), flushed to the disk, renamed over the target, and the folder flushed so the rename
itself survives a power cut. A reader sees the previous file or the new one, never a mix; two
runs given the same path cannot write into one file, and a name planted in a shared folder is
never followed (`mkstemp` creates a new file, refusing one that exists, a symlink included).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# The process's umask, read once at import (reading it means setting it): a new file gets the
# permissions `open` would have given it, not mkstemp's owner-only ones.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def sync_folder(folder: Path) -> None:
    """Flushes a folder's entries (a rename into it) to the disk; a no-op where folders cannot
    be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to fsync a folder: the rename stands anyway
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def replaced(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new contents into; when the block ends without an
    error, they replace `path` whole. On an error (or a signal's exception) the temporary file
    is removed and `path`, if it existed, is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_folder(path.parent)


def write_bytes(path: str | Path, data: bytes) -> None:
    with replaced(path) as f:
        f.write(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())
