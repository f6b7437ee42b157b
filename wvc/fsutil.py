"""File-system primitives: the one careful-save routine and path validation.

``atomic_write`` is the only way wvc makes a file durable: write a temp file in the
destination directory, fsync it, rename it over the target, fsync the directory. A crash
leaves either the old file or the new one, plus at worst a temp file that gc removes.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import mmap
import os
import tempfile
from pathlib import Path, PurePosixPath

from . import settings
from .errors import UnsafePath

log = logging.getLogger(__name__)

TEMP_PREFIX = ".wvc-tmp-"
MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255


def umask() -> int:
    """The process's umask, without changing it where the kernel reports it (Linux 4.7+)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and put it back at once
    os.umask(mask)
    return mask


def file_mode(executable: bool = False) -> int:
    """The mode a new file gets, as ``open()`` would give it: 0666 (0777 for an executable)
    less the umask. A temp file starts at 0600 (mkstemp); renamed into place as it is, a
    checked-out file or a directory remote's pack would be unreadable to everyone else."""
    return (0o777 if executable else 0o666) & ~umask()


def fsync_dir(path: os.PathLike | str) -> None:
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot fsync a directory; the rename still stands
        log.debug("fsync of directory %s failed (%s): the rename stands, its durability is the file system's", path, exc)
    finally:
        os.close(fd)


# A durable file asks the kernel to start writing every this many bytes: the final fsync
# then waits for at most this much.
WRITEBACK_BYTES = 32 << 20
# A pack's fsync is the commit's last step, with nothing left to overlap it: at 32 MiB a
# many-tensor commit's 62 MB pack waited 22-26 ms in it, at 8 MiB 6-7 ms. (A checkout's
# output waits ~10 ms either way, its writes overlapping the decoding; at 8 MiB its median
# over 10 A/B pairs was 3% slower, within the noise: left at 32.)
PACK_WRITEBACK_BYTES = 8 << 20


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

    def __init__(self, fh, every: int | None = None):
        self.fh = fh
        self.every = every or WRITEBACK_BYTES
        self.written = self.started = 0
        self.start_writing = sync_file_range()

    def write(self, data) -> int:
        n = self.fh.write(data)
        self.written += n
        if self.start_writing is not None and self.written - self.started >= self.every:
            self.fh.flush()
            self.start_writing(self.fh.fileno(), self.started, self.written - self.started, SYNC_FILE_RANGE_WRITE)
            self.started = self.written
        return n

    def __getattr__(self, name):
        return getattr(self.fh, name)


DIRECT_ALIGN = 4096  # O_DIRECT wants buffer, file offset and length aligned to the logical block
DIRECT_BUFFER = 8 << 20
DIRECT_MIN_BYTES = 64 << 20  # smaller files: the page cache's copy costs too little to matter


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def wants_direct_io(size: int) -> bool:
    """Whether a durable file of ``size`` bytes is written with O_DIRECT (DirectWriter).

    By default only files larger than half the machine's memory: those would not stay in
    the page cache anyway, and writing them through it evicts everything else. A smaller
    file is better left cached: a checkout is usually followed by loading the model, and
    reading a 1 GB file back from this VM's disk cost more (1.6 s) than O_DIRECT saved
    (0.2-0.4 s of a checkout). ``WVC_DIRECT_IO=1`` asks for it from 64 MiB, ``=0`` never.
    """
    mode = settings.text("WVC_DIRECT_IO", "auto")
    if mode == "0" or not hasattr(os, "O_DIRECT") or size < DIRECT_MIN_BYTES:
        return False
    return mode == "1" or size > physical_memory() // 2


class DirectWriter:
    """A write-only file that bypasses the page cache (O_DIRECT), for big durable files.

    Why: a checked-out file must reach the disk before it is renamed into place anyway, and
    through the page cache the kernel first copies every byte into its cache (a fifth of a
    1 GB checkout's CPU, on the thread that feeds the decoders) and then writes it back.
    Here bytes are copied into one of two aligned buffers and a helper thread writes the
    full one straight to the device while the other fills. The tail is written padded to
    the block size, then the file is truncated to its true length.

    Where the file system refuses O_DIRECT (EINVAL: tmpfs on older kernels, some network
    file systems), the writer clears the flag and goes on with ordinary writes: the bytes
    and the durability (the caller's fsync) are the same either way.
    """

    @classmethod
    def open(cls, fd: int) -> "DirectWriter | None":
        import fcntl

        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError:
            return None
        return cls(fd)

    def __init__(self, fd: int):
        from concurrent.futures import ThreadPoolExecutor

        self.fd = fd
        self.direct = True
        self.buffers = [mmap.mmap(-1, DIRECT_BUFFER) for _ in range(2)]  # page-aligned
        self.current = 0
        self.fill = 0  # bytes in the current buffer
        self.flushed = 0  # file offset of the current buffer's first byte
        self.pending = None  # the helper's write of the other buffer
        self.helper = ThreadPoolExecutor(1, thread_name_prefix="wvc-write")

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            take = min(len(view) - pos, DIRECT_BUFFER - self.fill)
            self.buffers[self.current][self.fill : self.fill + take] = view[pos : pos + take]
            self.fill += take
            pos += take
            if self.fill == DIRECT_BUFFER:
                self._hand_over(DIRECT_BUFFER)
        return len(view)

    def _hand_over(self, length: int) -> None:
        """Start writing the current buffer's first ``length`` bytes; switch to the other."""
        self._wait()
        self.pending = self.helper.submit(self._write_at, self.current, length, self.flushed)
        self.flushed += self.fill
        self.current ^= 1
        self.fill = 0

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()  # re-raises the helper's OSError (disk full, I/O error)

    def _write_at(self, index: int, length: int, offset: int) -> None:
        view = memoryview(self.buffers[index])[:length]
        while view:
            try:
                n = os.pwrite(self.fd, view, offset)
            except OSError as exc:
                if not (self.direct and exc.errno == errno.EINVAL):
                    raise
                self._go_buffered()
                continue
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            if self.direct and n % DIRECT_ALIGN:
                self._go_buffered()  # a short unaligned write: finish without O_DIRECT
            view, offset = view[n:], offset + n

    def _go_buffered(self) -> None:
        import fcntl

        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False

    def finish(self) -> None:
        """Write the tail and give the file its exact length (the caller fsyncs)."""
        try:
            size = self.flushed + self.fill
            if self.fill:
                padded = -(-self.fill // DIRECT_ALIGN) * DIRECT_ALIGN
                self.buffers[self.current][self.fill : padded] = bytes(padded - self.fill)
                self._hand_over(padded)
            self._wait()
            os.ftruncate(self.fd, size)
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._wait()  # on an error path the helper may still hold a buffer
        self.helper.shutdown(wait=True)
        for buf in self.buffers:
            with contextlib.suppress(BufferError):  # an error's traceback may still view it;
                buf.close()  # then it is unmapped when collected


def claim_temp(fd: int) -> None:
    """Mark a temp file as being written: an exclusive flock on its descriptor, which the
    kernel drops when the file is closed or its process dies. gc leaves a claimed temp file
    alone whatever its grace period (``temp_in_use``): with ``--grace 0`` it deleted a
    commit's half-written pack or file under it."""
    try:
        import fcntl
    except ImportError:  # (Windows: gc's grace period alone protects it)
        return
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def temp_in_use(path: Path) -> bool:
    """Whether a live process is writing ``path`` (it holds the claim of ``claim_temp``)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False  # gone, a directory, or a link: not a claimed file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def new_temp(directory: os.PathLike | str, executable: bool = False) -> tuple[int, str]:
    """(descriptor, path) of a new temp file in ``directory`` (TEMP_PREFIX: scans skip it, gc
    collects it once stale), claimed (claim_temp) and with the mode a new file gets."""
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        claim_temp(fd)
        os.fchmod(fd, file_mode(executable))
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


@contextlib.contextmanager
def atomic_writer(target: os.PathLike | str, durable: bool = True, size_hint: int = 0, executable: bool = False):
    """Yield a binary file object; on clean exit it atomically replaces ``target``.

    ``size_hint``: the expected size; a durable file may be written with O_DIRECT
    (DirectWriter; see wants_direct_io). The file gets the umask's mode (file_mode).
    """
    target = Path(target)
    fd, tmp = new_temp(target.parent, executable)
    try:
        with os.fdopen(fd, "wb") as fh:
            direct = None
            if durable and wants_direct_io(size_hint):
                direct = DirectWriter.open(fh.fileno())
            if direct is not None:
                try:
                    yield direct
                except BaseException:
                    direct.close()
                    raise
                direct.finish()
            else:
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


WORK_DIR_PREFIX = "wvc-work-"


def make_work_dir(parent: Path, kind: str) -> Path:
    """A private temp directory for one operation (a fetch's downloads, a push's pack),
    named with its kind and our pid so that a later operation can tell a killed run's
    leftover (its process is gone) from a running one's: see sweep_work_dirs."""
    return Path(tempfile.mkdtemp(prefix=f"{WORK_DIR_PREFIX}{kind}-{os.getpid()}-", dir=parent))


@contextlib.contextmanager
def work_dir(parent: Path, kind: str):
    """make_work_dir, removed on the way out."""
    import shutil

    path = make_work_dir(parent, kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def work_dir_owner_alive(path: Path) -> bool:
    try:
        pid = int(path.name[len(WORK_DIR_PREFIX):].split("-")[1])
    except (IndexError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def stale_work_dirs(parent: Path) -> list[Path]:
    """Work directories in ``parent`` whose process is gone (a killed fetch, push, lazy fetch)."""
    try:
        found = [p for p in parent.iterdir() if p.name.startswith(WORK_DIR_PREFIX) and p.is_dir()]
    except OSError:
        return []
    return sorted(p for p in found if not work_dir_owner_alive(p))


def sweep_work_dirs(parent: Path) -> int:
    """Remove stale_work_dirs; returns how many. Every operation that makes one calls it."""
    import shutil

    stale = stale_work_dirs(parent)
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return len(stale)


LOCK_WAIT_SECONDS = 60.0  # WVC_LOCK_TIMEOUT overrides


@contextlib.contextmanager
def file_lock(path: Path, holder: str, timeout: float | None = None, what: str = "the working tree"):
    """An exclusive advisory lock (flock) on ``path``, waited for up to WVC_LOCK_TIMEOUT
    seconds; ``holder`` (pid and verb) is written into the file for the next waiter's
    message, which names ``what`` the lock guards. The kernel drops the lock when its
    process dies: a killed holder never leaves a stale lock behind."""
    import fcntl
    import time

    from .errors import LockedError

    limit = settings.number("WVC_LOCK_TIMEOUT", LOCK_WAIT_SECONDS) if timeout is None else timeout
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as exc:
                if time.monotonic() >= deadline:
                    other = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                    raise LockedError(f"{what} is locked by {other}; wait for it to finish "
                                      f"(waited {limit:g} s)") from exc
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


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
    except UnicodeEncodeError as exc:
        raise UnsafePath(f"path is not valid UTF-8: {path!r}") from exc
    if path.startswith("/"):
        raise UnsafePath(f"absolute path: {path!r}")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePath(f"path has an empty, '.' or '..' component: {path!r}")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise UnsafePath(f"path component too long: {part[:40]!r}...")
    for part in parts:
        if (reserved := reserved_name(part)) is not None:
            raise UnsafePath(f"path names a {reserved} directory: {path!r} (never committed, fetched or written: "
                             f"a {reserved} from a version would take effect on the machine that checks it out)")
    return path


# Code points HFS+ ignores in names (git's is_hfs_dotgit list): ".g\u200cit" is ".git" there.
_HFS_IGNORABLE = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
                                *range(0x206A, 0x2070), 0xFEFF])
RESERVED = (".git", ".wvc")


def fold_name(part: str) -> str:
    """A name as case-insensitive, Unicode-normalising file systems see it (macOS, Windows,
    SMB shares): NFC, case-folded, without the code points HFS+ ignores."""
    import unicodedata

    return unicodedata.normalize("NFC", part.translate(_HFS_IGNORABLE)).casefold()


def reserved_name(part: str) -> str | None:
    """``.git`` or ``.wvc`` if some file system would take ``part`` for that directory: any
    case, HFS+ ignorable code points, Windows' trailing dots and spaces and ``::$DATA``
    streams, and 8.3 short names (``GIT~1``, as git refuses them), else None."""
    folded = fold_name(part).split(":", 1)[0].rstrip(". ")
    for name in RESERVED:
        if folded == name or (folded.startswith(name[1:] + "~") and folded[len(name):].isdigit()):
            return name
    return None


def folded_clashes(paths) -> list[tuple[str, str]]:
    """Pairs of paths that are distinct here but one name where names fold (fold_name):
    two files, or a file and a directory. Checked out there, one would overwrite the other."""
    files: dict[str, str] = {}
    clashes = []
    for p in paths:
        key = "/".join(fold_name(part) for part in p.split("/"))
        if key in files:
            clashes.append((files[key], p))
        else:
            files[key] = p
    for key, p in files.items():
        parts = key.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in files and files[prefix] != "/".join(p.split("/")[:i]):
                clashes.append((files[prefix], p))
    return clashes


def selected(path: str, specs) -> bool:
    """Whether repository path ``path`` is one of ``specs`` or under one ("." and "" select
    everything): how `checkout -- PATH`, `log -- PATH` and `diff -- PATH` read their PATHs."""
    return any(q.strip("/") in ("", ".") or path == q.strip("/") or path.startswith(q.strip("/") + "/")
               for q in specs)


def resolve_inside(root: Path, relpath: str, *, replacing_link: bool = False) -> Path:
    """``root/relpath`` after validation, refusing any symlinked parent directory.

    A symlink planted in the working tree (``weights -> /etc``) must not redirect a write.
    A symlink at ``relpath`` itself is refused too, unless ``replacing_link``: a caller that
    renames over it or unlinks it (a committed symlinked file) replaces the link, never its
    target.
    """
    validate_relpath(relpath)
    target = root.joinpath(*PurePosixPath(relpath).parts)
    parent = root
    for part in PurePosixPath(relpath).parts[:-1]:
        parent = parent / part
        if parent.is_symlink():
            raise UnsafePath(f"refusing to write through symlinked directory {parent}")
    if target.is_symlink() and not replacing_link:
        raise UnsafePath(f"refusing to overwrite symlink {target}")
    return target
