"""The backend interface: what a remote must do with plain files (list them with the refs,
read one within a bound, read a range, download, publish files and refs by compare-and-swap,
delete), and the retries and errors every backend shares. Where each file goes is the layout
map's (``remotes/layout.py``); what the files mean is the remote repository's
(``remotes/repository.py``).

A push uploads objects first and moves refs last, as one compare-and-swap (``publish``):
the refs must still be what the pusher read (``Listing.version``), else it is refused.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .. import ids
from ..errors import NonFastForward, NotAWvcRemote, RemoteChanged, RemoteError  # noqa: F401 - the backends' vocabulary
from ..store.refs import check_ref_name

MAX_PACK_BYTES = 64 << 30  # one pack a push (or a compaction) writes
MAX_SMALL_OBJECT = 128 << 20  # commits and trees (versions.MAX_TREE_BYTES)
MAX_BASE_RECORD = 64 << 10
MAX_PRUNED_RECORD = 64 << 20  # a pruned/ record: ~70 bytes a commit id


def upload_progress(progress, files):
    """Start an "uploading" phase for ``files`` on ``progress`` (None: nothing); returns it."""
    from ..progress import NULL

    progress = progress or NULL
    progress.start(sum(map(content_size, files.values())), "uploading")
    return progress


def content_size(content: Path | bytes) -> int:
    """The size of one of ``publish``'s files (bytes in memory, or a file's path)."""
    return len(content) if isinstance(content, bytes) else Path(content).stat().st_size


@contextlib.contextmanager
def local_write_errors(dest):
    """A full disk while downloading is about the local copy, never the remote's file: the
    error names ``dest`` (a clone onto a full disk named the remote's path)."""
    import errno

    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(dest)) from exc
        raise


class TransientError(RemoteError):
    """A failed read that the same request may well get right: a 5xx answer, a connection
    reset, a body cut short, an answer that is not what the service speaks (a proxy's page)."""


READ_ATTEMPTS = 5
FIRST_RETRY_SECONDS = 0.25


def retries_reads(method):
    """Repeat an idempotent read that failed transiently, with jittered exponential back-off
    (0.25, 0.5, 1, 2 s: ~4 s in all), before reporting it. Only a complete, verified read
    is ever judged corrupt by the callers; a short one raises TransientError here."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        delay = FIRST_RETRY_SECONDS
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return method(*args, **kwargs)
            except TransientError as exc:
                if attempt == READ_ATTEMPTS:
                    raise RemoteError(f"{exc} (tried {READ_ATTEMPTS} times)") from exc
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2

    return wrapper


@dataclass(frozen=True, order=True)
class Handle:
    """A file of a remote by what it is (restic's handle): ``kind`` and ``name``. Backends are
    given handles, never paths; the layout map alone turns one into a path (``path``)."""
    kind: str  # marker, base, ref, pack, idx, catalog, retired, pruned, step, commit, tree
    name: str = ""


class LayoutRules(Protocol):
    """What a backend asks the layout map it is given (remotes/layout.py's RemoteLayout
    answers): which files are refs, which folders a backend that lists folder by folder lists,
    where a retired file waits (the attic), a Storage Bucket's ref log, and each handle's path."""

    refs: str
    attic: str
    reflog: str
    listed_folders: tuple
    top_level: tuple
    max_ref_bytes: int

    def path(self, handle: Handle) -> str: ...

    def movable(self, handle: Handle) -> bool: ...

    def attic_path(self, handle: Handle) -> str: ...

    def attic_folder(self, kind: str) -> str: ...

    def check_ref_count(self, url: str, paths) -> list[str]: ...

    def parse_refs(self, files: dict[str, bytes]) -> dict[str, str]: ...


@dataclass
class Listing:
    """What a backend lists: plain files, and the refs with what a compare-and-swap checks."""
    refs: dict[str, str]  # "refs/heads/main" -> commit id
    version: str | None  # what publish's compare-and-swap checks (hub commit sha, or refs digest)
    files: frozenset = frozenset()  # every path listed (what a pinned reader may read), the attic's aside
    # what the backend knows of a listed file's content: S3, each ref's ETag (its compare-and-swap
    # token); the Hub, README.md's git blob id (is the card as a push would write it?)
    tokens: dict[str, str] = field(default_factory=dict)


class Backend:
    """A backend: small-file reads, whole and ranged pack reads, and atomic publish, of files
    named by their handles (their paths are the layout map's: ``self.layout.path``)."""

    url: str
    # The format's rules this backend asks (which files are refs, the attic, the listed
    # folders), given when it is made: remotes/layout.py's RemoteLayout. No backend imports them.
    layout: "LayoutRules"
    bytes_downloaded: int = 0
    bytes_uploaded: int = 0
    bytes_copied: int = 0  # server-side copies compose made (no byte crossed the network)

    # Whether wvc.json marks this backend's remotes (a directory, S3: a place that may hold
    # anything); the Hub and a bucket are recognised by their files (remotes/repository.py).
    keeps_marker = False
    # Why the remote can be read but not written (a Hub URL pinned to a revision), or None.
    read_only: str | None = None

    def listing(self) -> Listing:
        """Every file (the attic's aside) with the refs, read together. A container that does
        not exist (a Hub repository, a bucket) raises ``RemoteNotFound``; a directory or an S3
        prefix with nothing in it lists nothing. No file is judged here."""
        raise NotImplementedError

    def make(self) -> None:
        """Create the container ``listing`` found missing (a Hub repository, a bucket, a
        directory), private; the first push's."""

    def write_new(self, handle: Handle, data: bytes) -> None:
        """Write a small file that must not be there yet (the marker); one that is stays."""
        raise NotImplementedError

    def read_ref(self, ref: str) -> str | None:
        """One ref's commit with one small read (a follower's poll), validated; None when the
        remote has no such ref. Not pinned to a listing: a poll needs only this."""
        check_ref_name(ref.split("/", 2)[-1], "remote ref")
        limit = self.layout.max_ref_bytes
        data = self.read(Handle("ref", ref.partition("/")[2]), limit + 1)
        if data is None:
            return None
        value = data.strip().decode("ascii", "replace")
        if len(data) > limit or not ids.is_object_id(value):
            raise RemoteError(f"remote ref {ref} does not hold a commit id")
        return value

    def read(self, handle: Handle, limit: int) -> bytes | None:
        """A small file (None if absent), refusing more than ``limit`` bytes."""
        raise NotImplementedError

    def download(self, handle: Handle, dest: Path, limit: int) -> None:
        """A file to ``dest`` (packs), refusing more than ``limit`` bytes."""
        raise NotImplementedError

    def read_range(self, handle: Handle, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of a file from ``offset`` (streaming reads into packs)."""
        raise NotImplementedError

    # Whether publish can delete files in the same atomic step (the Hub: one commit). Other
    # backends retire replaced files and delete them after a grace period (remotes/compaction.py).
    deletes_atomically = False

    def publish(self, files: dict[Handle, Path | bytes], refs: dict[str, str | None], expected: Listing,
                message: str, delete: tuple[Handle, ...] = (), progress=None) -> None:
        """Upload ``files``, then set ``refs`` (None deletes) iff the remote is still ``expected``;
        ``delete`` (only where ``deletes_atomically``) goes in the same step; ``progress``
        (a wvc.progress.Progress) is told the bytes uploaded."""
        raise NotImplementedError

    def delete(self, handles: list[Handle], *, in_attic: bool = False) -> None:
        """Remove files (retired ones, after their grace period; ``in_attic``: their copies
        moved to the attic); absent ones are no error."""
        raise NotImplementedError

    # Whether retired packs and catalogs move to the attic (``layout.attic_path``), out of what
    # ``state`` lists. Such a backend's reads of a ``layout.movable`` file that is gone look in the
    # attic, so a reader pinned to a listing from before the move still finds every file.
    moves_retired = False

    def move_to_attic(self, handles: list[Handle]) -> None:
        """Move retired ``movable`` files into the attic (a file already moved, or absent, is
        no error). Only a move that completes hides a file: one the backend cannot move
        stays where it is, retired by its record all the same."""
        raise NotImplementedError

    def attic_names(self, kind: str) -> list[str]:
        """The names of the files of a kind in the attic (the purge's list of moved records)."""
        raise NotImplementedError

    # Whether the backend can build a file from byte ranges of files it holds, without the
    # client sending them (a directory: a copy on its file system). Compaction then sends
    # only what the remote does not have (remotes/compaction.py, ``Recipe``).
    composes = False

    def compose(self, handle: Handle, pieces: list, expected: tuple[str, int], local: Path) -> int | None:
        """Write ``handle``'s file (absent from the listing: an immutable, content-named pack) as the
        concatenation of ``pieces``: ``(source handle, offset, length)`` ranges of files the
        remote holds, or ``bytes`` the client sends; ``expected``: (blake3 PACK checksum of all
        but the trailer, size), checked before it becomes visible; ``local``: the same file as
        the client built it, for ranges the backend cannot copy (too small to be a part of
        their own). Returns the bytes sent, or None when composing would save nothing here
        (the caller then uploads ``local`` as usual)."""
        raise NotImplementedError
