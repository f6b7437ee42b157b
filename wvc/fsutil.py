"""File-system primitives: the one careful-save routine and path validation.

``atomic_write`` is the only way wvc makes a file durable: write a temp file in the
destination directory, fsync it, rename it over the target, fsync the directory. A crash
leaves either the old file or the new one, plus at worst a temp file that gc removes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path, PurePosixPath

from .errors import UnsafePath

TEMP_PREFIX = ".wvc-tmp-"
MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255


def fsync_dir(path: os.PathLike | str) -> None:
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory; the rename still stands
        pass
    finally:
        os.close(fd)


WRITEBACK_BYTES = 32 << 20  # a durable file asks the kernel to start writing every this many bytes


@functools.lru_cache(maxsize=1)
def sync_file_range():
    """libc's sync_file_range (Linux), or None."""
    import ctypes  # here: not every command writes a file

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writing the range, do not wait


class EarlyWriteback:
    """A file whose written bytes go to disk while more are produced (a checked-out file, a pack).

    Without it the fsync that makes the file durable found all of it dirty and waited for
    the whole write: half a second of a 1 GB checkout, most of a second of a first commit.
    SYNC_FILE_RANGE_WRITE only starts the writes (no waiting, the page cache kept), so the
    final fsync waits for the last stretch only. Durability, and any I/O error, still come
    from that fsync, so the return value here is not needed.
    """

    def __init__(self, fh):
        self.fh = fh
        self.written = self.started = 0
        self.start_writing = sync_file_range()

    def write(self, data) -> int:
        n = self.fh.write(data)
        self.written += n
        if self.start_writing is not None and self.written - self.started >= WRITEBACK_BYTES:
            self.fh.flush()
            self.start_writing(self.fh.fileno(), self.started, self.written - self.started, SYNC_FILE_RANGE_WRITE)
            self.started = self.written
        return n

    def __getattr__(self, name):
        return getattr(self.fh, name)


@contextlib.contextmanager
def atomic_writer(target: os.PathLike | str, durable: bool = True):
    """Yield a binary file object; on clean exit it atomically replaces ``target``."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield EarlyWriteback(fh) if durable else fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
        if durable:
            fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write(target: os.PathLike | str, data: bytes, durable: bool = True) -> None:
    with atomic_writer(target, durable) as fh:
        fh.write(data)


def validate_relpath(path: str) -> str:
    """Check a repository-relative POSIX path from an untrusted source; return it.

    Refuses absolute paths, ``..``, empty or ``.`` components, backslashes, NUL and other
    control characters, and anything inside ``.wvc``: a manifest must never make checkout
    write outside the working tree or into the repository's own state.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePath("empty path")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise UnsafePath(f"path too long: {path[:80]!r}...")
    if any(ord(c) < 32 or c == "\x7f" for c in path) or "\\" in path:
        raise UnsafePath(f"path has control characters or backslashes: {path!r}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"path is not valid UTF-8: {path!r}") from None
    if path.startswith("/"):
        raise UnsafePath(f"absolute path: {path!r}")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePath(f"path has an empty, '.' or '..' component: {path!r}")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise UnsafePath(f"path component too long: {part[:40]!r}...")
    if parts[0].lower() == ".wvc":
        raise UnsafePath(f"path inside .wvc: {path!r}")
    return path


def resolve_inside(root: Path, relpath: str) -> Path:
    """``root/relpath`` after validation, refusing any symlinked parent directory.

    A symlink planted in the working tree (``weights -> /etc``) must not redirect a write.
    """
    validate_relpath(relpath)
    target = root.joinpath(*PurePosixPath(relpath).parts)
    parent = root
    for part in PurePosixPath(relpath).parts[:-1]:
        parent = parent / part
        if parent.is_symlink():
            raise UnsafePath(f"refusing to write through symlinked directory {parent}")
    if target.is_symlink():
        raise UnsafePath(f"refusing to overwrite symlink {target}")
    return target
