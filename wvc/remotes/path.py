"""A directory remote: a shared disk or NFS team folder.

Objects are written with the careful save (temp, fsync, rename). Refs move under a lock
file created with O_EXCL; the compare-and-swap re-reads the refs under the lock, so two
pushers never both win.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from ..errors import RemoteFileTooLarge
from ..fsutil import TEMP_PREFIX, atomic_write, atomic_writer, file_mode, fsync_dir, validate_relpath
from .interface import Listing, Backend, RemoteChanged, RemoteError, content_size, local_write_errors, upload_progress

LOCK = "refs.lock"
LOCK_STALE_SECONDS = 600


def _copy_range(src: int, dst: int, offset: int, length: int, what: str) -> None:
    """``length`` bytes of ``src`` from ``offset`` appended to ``dst`` (at its position)."""
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src, dst, length - done, offset + done)
        except OSError:  # (a file system without it, or across devices)
            data = os.pread(src, min(1 << 20, length - done), offset + done)
            n = os.write(dst, data) if data else 0
        if n <= 0:
            raise RemoteError(f"remote file {what} is shorter than its index says")
        done += n


def _open_regular(path: Path, what: str):
    """``path`` opened for reading if it is a regular file, else RemoteError; None if it is
    missing. Opened non-blocking and checked on the descriptor: a FIFO (or a device) put
    where a pack or ref should be would block a read forever, and a check before the open
    could be raced."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RemoteError(f"remote file {what} cannot be read ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RemoteError(f"remote file {what} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _read_at_most(path: Path, n: int) -> bytes:
    fh = _open_regular(path, str(path))
    if fh is None:
        raise FileNotFoundError(path)
    with fh:
        return fh.read(n)


class PathBackend(Backend):
    def __init__(self, root: str, layout):
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)
        self.layout = layout

    def _file(self, path: str) -> Path:
        return self.root.joinpath(*validate_relpath(path).split("/"))

    keeps_marker = True

    def write_new(self, handle, data: bytes) -> None:
        target = self._file(self.layout.path(handle))
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)  # the first push makes the directory
            atomic_write(target, data)

    def _refs(self) -> dict[str, str]:
        files, layout = {}, self.layout
        refs_dir = self._file(layout.refs.rstrip("/"))
        if refs_dir.is_dir():
            found = [p for p in refs_dir.rglob("*") if not p.name.startswith(TEMP_PREFIX)]
            layout.check_ref_count(self.url, [f"{layout.refs}{i}" for i, p in enumerate(found) if not p.is_dir()])
            for p in found:
                # a pusher's ref being written is a temp file until its rename: not a ref
                if p.is_file() and not p.is_symlink():
                    # at most one byte past what a ref may hold: a huge (or sparse) file is
                    # refused by parse_refs without being read
                    files[p.relative_to(self.root).as_posix()] = _read_at_most(p, layout.max_ref_bytes + 1)
        return layout.parse_refs(files)

    def listing(self) -> Listing:
        refs = self._refs()
        # the top level's files, and folders not wvc's as "name/" (someone else's content: the
        # remote repository judges); then the folders wvc lists file by file (refs/ was read,
        # objects/ is read by name, attic/ is never listed)
        paths = [name if (self.root / name).is_file() else f"{name}/" for name in _names(self.root)
                 if not name.startswith(TEMP_PREFIX) and name != LOCK and f"{name}/" not in self.layout.top_level]
        paths += [f"{d}{name}" for d in self.layout.listed_folders
                  for name in _names(self.root / d) if not name.startswith(TEMP_PREFIX)]
        return Listing(refs, _refs_version(refs), frozenset(paths))

    def _open(self, handle, path: str):
        """``handle``'s file (at ``path``) opened (_open_regular), or, for a retired pack or
        catalog that moved since the caller listed it, its copy in the attic; None if neither
        is there."""
        fh = _open_regular(self._file(path), path)
        if fh is None and self.layout.movable(handle):
            fh = _open_regular(self._file(self.layout.attic_path(handle)), path)
        return fh

    def read(self, handle, limit: int) -> bytes | None:
        path = self.layout.path(handle)
        fh = self._open(handle, path)
        if fh is None:
            return None
        with fh:
            data = fh.read(limit + 1)  # the size is checked on what was read: no stat-then-read race
        if len(data) > limit:
            raise RemoteFileTooLarge(f"remote file {path} is larger than allowed")
        self.bytes_downloaded += len(data)
        return data

    def download(self, handle, dest: Path, limit: int) -> None:
        path = self.layout.path(handle)
        fh = self._open(handle, path)
        if fh is None:
            raise RemoteError(f"remote file {path} is missing")
        with fh:
            if os.fstat(fh.fileno()).st_size > limit:
                raise RemoteFileTooLarge(f"remote file {path} is larger than allowed")
            with local_write_errors(dest), open(dest, "wb") as out:
                shutil.copyfileobj(fh, out, 1 << 20)
        self.bytes_downloaded += dest.stat().st_size

    def read_range(self, handle, offset: int, length: int) -> bytes:
        path = self.layout.path(handle)
        fh = self._open(handle, path)
        if fh is None:
            raise RemoteError(f"remote file {path} is missing")
        with fh:
            fh.seek(offset)
            data = fh.read(length)
        if len(data) != length:
            raise RemoteError(f"remote file {path} is shorter than its index says")
        self.bytes_downloaded += len(data)
        return data

    def delete(self, handles, *, in_attic: bool = False) -> None:
        where = self.layout.attic_path if in_attic else self.layout.path
        for handle in handles:
            self._file(where(handle)).unlink(missing_ok=True)

    moves_retired = True  # a rename on the remote's file system

    def move_to_attic(self, handles) -> None:
        for handle in handles:
            target = self._file(self.layout.attic_path(handle))
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(self._file(self.layout.path(handle)), target)  # (atomic: the file is in one place or the other)
            except FileNotFoundError:
                continue  # moved already, or deleted by a purge

    def attic_names(self, kind: str) -> list[str]:
        return [n for n in _names(self._file(self.layout.attic_folder(kind).rstrip("/"))) if not n.startswith(TEMP_PREFIX)]

    composes = True  # compaction copies ranges of the remote's own packs here instead of uploading them

    def compose(self, handle, pieces: list, expected: tuple[str, int], local: Path | None = None) -> int:
        """See Backend.compose: ranges copied on the remote's file system (``copy_file_range``:
        server-side on NFS 4.2, reflinked where the file system can), checked against the
        pack's checksum, fsynced, then renamed into place."""
        from ..store.packs import pack_checksum

        path = self.layout.path(handle)
        target = self._file(path)
        if target.exists():
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=target.parent)
        sent = copied = 0
        try:
            os.fchmod(fd, file_mode())
            for piece in pieces:
                if isinstance(piece, bytes):
                    view = memoryview(piece)
                    while view:
                        view = view[os.write(fd, view):]
                    sent += len(piece)
                    continue
                source, offset, length = piece
                source_path = self.layout.path(source)
                src = self._open(source, source_path)
                if src is None:
                    raise RemoteError(f"remote file {source_path} vanished while compacting")
                with src:
                    _copy_range(src.fileno(), fd, offset, length, source_path)
                copied += length
            if os.fstat(fd).st_size != expected[1] or pack_checksum(fd, expected[1]) != expected[0]:
                raise RemoteError(f"remote pack {path} did not come out as composed (a source changed?)")
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, target)
            fsync_dir(target.parent)
        finally:
            if fd >= 0:
                os.close(fd)
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.bytes_uploaded += sent
        self.bytes_copied += copied
        return sent

    def publish(self, files, refs, expected: Listing, message: str, delete=(), progress=None) -> None:
        progress = upload_progress(progress, files)
        for handle, content in files.items():  # objects first: immutable, so rewriting is harmless
            target = self._file(self.layout.path(handle))
            target.parent.mkdir(parents=True, exist_ok=True)
            progress.advance(content_size(content))
            if target.exists():
                continue
            with atomic_writer(target) as fh:
                if isinstance(content, bytes):
                    fh.write(content)
                else:
                    with open(content, "rb") as src:
                        shutil.copyfileobj(src, fh, 1 << 20)
            self.bytes_uploaded += target.stat().st_size
        progress.close()
        with self._lock():  # then the refs, compare-and-swap under the lock
            # (the refs alone: a long run's directory lists thousands of files in the grace hour)
            if _refs_version(self._refs()) != expected.version:
                raise RemoteChanged("the remote's refs changed while pushing; fetch and try again")
            for ref, target_id in refs.items():
                p = self._file(ref)
                if target_id is None:
                    p.unlink(missing_ok=True)
                else:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(p, (target_id + "\n").encode())

    @contextlib.contextmanager
    def _lock(self):
        lock = self.root / LOCK
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError as exc:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:  # its holder just released it: another push, as below
                raise RemoteChanged(f"another push holds {lock}; try again") from exc
            if age < LOCK_STALE_SECONDS:
                raise RemoteChanged(f"another push holds {lock}; try again") from exc
            lock.unlink(missing_ok=True)  # left by a crashed pusher
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            yield
        finally:
            lock.unlink(missing_ok=True)


def _refs_version(refs: dict) -> str:
    """What a compare-and-swap compares: the refs, all of them."""
    return hashlib.sha256(json.dumps(refs, sort_keys=True).encode()).hexdigest()


def _names(folder: Path) -> list[str]:
    """The names in ``folder`` (none if it is missing): plain strings, no Path per file."""
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
