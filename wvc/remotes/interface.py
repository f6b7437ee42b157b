"""The remote interface and layout. Remotes hold plain files, so any store can hold them:

    wvc.json                              {"format": 1}
    base.json                             the base model, if any: {"url", "tree", "commit"} (basemodel/record.py)
    packs/pack-<hex>.pack, .idx           immutable packs (see store/packs.py) and their index
    catalogs/<hex>.cat                    format 2: a segment's catalog (remotes/catalog.py)
    retired/, pruned/, steps/             records: retired files, pruned versions, followers' steps
    attic/<path>                          retired files moved out of the listing (``moves_retired``)
    objects/commits/<2 hex>/<id>          format 1: immutable commit objects (canonical bytes)
    objects/trees/<2 hex>/<id>            format 1: immutable tree objects
    refs/heads/<branch>, refs/tags/<tag>  the only mutable files: a commit id and a newline

A push uploads objects first and moves refs last, as one compare-and-swap (``publish``):
the refs must still be what the pusher read (``RemoteState.version``), else it is
refused. Every name read from a remote is validated before use; every object is
hash-verified by the caller before it enters a local store.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import ids
from ..errors import NonFastForward, NotAWvcRemote, RemoteChanged, RemoteError  # noqa: F401 - the backends' vocabulary
from ..store.refs import check_ref_name

FORMAT = 1
MAX_REF_BYTES = 200
# Each ref is a file read per listing (a GET on the Hub) and a row in a clone's database: a
# remote with 100,000 branches made a clone take 98 s. Runs make branches (run/<name>), so
# the bound is generous; past it, `wvc push --delete` or `gc --remote` is the way back.
MAX_REMOTE_REFS = 10_000
MAX_PACK_BYTES = 64 << 30  # one pack a push (or a compaction) writes
MAX_SMALL_OBJECT = 128 << 20  # commits and trees (versions.MAX_TREE_BYTES)
MAX_BASE_RECORD = 64 << 10
BASE_RECORD = "base.json"
_PACK = re.compile(r"^pack-([0-9a-f]{64})\.(pack|idx)$")
_CATALOG = re.compile(r"^catalogs/([0-9a-f]{64})\.cat$")
_RETIRED = re.compile(r"^retired/([0-9]{10}-[0-9a-f]{16})\.json$")
_PRUNED = re.compile(r"^pruned/([0-9]{10}-[0-9a-f]{16})\.json$")
MAX_PRUNED_RECORD = 64 << 20  # a pruned/ record: ~70 bytes a commit id
# Where a backend that can move files (``Remote.moves_retired``) keeps what compaction (or gc,
# or prune) replaced while it waits out the grace period, and the retired/ record naming it
# once every file moved: out of the folders every push lists, so a push's listing holds the
# live segments (O(log pushes)), not every segment and record of the last hour. A reader that
# listed such a file before it moved reads it here instead.
ATTIC = "attic/"
MOVABLE = ("packs/", "catalogs/", "pruned/", "retired/")


def attic_path(path: str) -> str:
    """Where a retired file (or a record whose files all moved) waits out the grace period."""
    return ATTIC + path


def movable(path: str) -> bool:
    """Whether ``path`` moves to the attic when it is retired (and is looked for there)."""
    return path.startswith(MOVABLE)


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


@dataclass
class RemoteState:
    refs: dict[str, str]  # "refs/heads/main" -> commit id
    version: str | None  # what publish's compare-and-swap checks (hub commit sha, or refs digest)
    packs: list[str] = field(default_factory=list)  # names of packs with a format-1 .idx
    base: bytes | None = None  # base.json as stored (untrusted: basemodel/record.py parses it)
    tokens: dict[str, str] = field(default_factory=dict)  # per-ref compare-and-swap tokens (S3 ETags)
    catalogs: list[str] = field(default_factory=list)  # format 2: one a segment (remotes/catalog.py)
    retired: list[str] = field(default_factory=list)  # retired/ records: files compaction replaced
    files: frozenset = frozenset()  # every path listed (what a pinned reader may read)
    pruned: list[str] = field(default_factory=list)  # pruned/ records: commits whose weights `prune --remote` dropped


_LISTED: dict[str, tuple[str, str] | None] = {}  # path -> (kind, name) or None: listing_state's parse, memoised
_LISTED_MAX = 1 << 20
_NAMED = (("catalog", _CATALOG), ("retired", _RETIRED), ("pruned", _PRUNED))


def _listed(path: str) -> tuple[str, str] | None:
    """(kind, name) of a listed path that names a ``catalog``, a ``retired`` or ``pruned``
    record, or an ``idx`` (a format-1 pack's index); None for any other. Memoised: a long
    run's remote lists the same thousands of files, most of them waiting out the grace hour,
    at every push and every poll."""
    try:
        return _LISTED[path]
    except KeyError:
        pass
    found = next(((kind, m.group(1)) for kind, pattern in _NAMED if (m := pattern.match(path))), None)
    if found is None and path.startswith("packs/") and (m := _PACK.match(path.rpartition("/")[2])) and m.group(2) == "idx":
        found = ("idx", m.group(1))
    if len(_LISTED) >= _LISTED_MAX:
        _LISTED.clear()
    _LISTED[path] = found
    return found


def listing_state(refs, version, paths, base, tokens=None) -> RemoteState:
    """A RemoteState from a backend's listing of every path."""
    paths = frozenset(paths)
    named: dict[str, list[str]] = {"catalog": [], "retired": [], "pruned": [], "idx": []}
    for p in paths:
        if (found := _listed(p)) is not None:
            named[found[0]].append(found[1])
    return RemoteState(refs, version, sorted(set(named["idx"])), base, tokens or {}, sorted(named["catalog"]),
                       sorted(named["retired"]), paths, sorted(named["pruned"]))


# What a wvc remote holds at its top level; on the Hub also the files every repository
# starts with. Anything else is someone else's content.
WVC_TOP = ("wvc.json", BASE_RECORD, "refs/", "packs/", "catalogs/", "retired/", "pruned/", "steps/", "objects/", ATTIC)
HUB_STARTERS = (".gitattributes", "README.md")


def is_wvc_layout(paths) -> bool:
    """Whether a listing holds any wvc state (a marker, refs, packs or catalogs)."""
    return any(p == t or (t.endswith("/") and p.startswith(t)) for p in paths for t in WVC_TOP)


def not_a_wvc_remote(url: str, paths, verb: str) -> "NotAWvcRemote":
    """The one line for a remote that holds other content and no wvc history."""
    from ..errors import NotAWvcRemote

    shown = sorted(p for p in paths if p not in HUB_STARTERS)
    listed = ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")
    if verb == "push":
        return NotAWvcRemote(f"{url} is not a wvc remote: it already holds {listed}; wvc will not write into it. "
                             "Push to a new repository (e.g. add a remote hf://ORG/NAME-wvc), or to version a "
                             f"fine-tune of this model: `wvc init --base {url}`")
    return NotAWvcRemote(f"{url} is not a wvc remote (it holds {listed}); to start a history from this model "
                         f"use `wvc init --base {url}`")


def commit_path(cid: str) -> str:
    return f"objects/commits/{cid[:2]}/{cid}"


def tree_path(tid: str) -> str:
    return f"objects/trees/{tid[:2]}/{tid}"


def pack_path(name: str, ext: str = "pack") -> str:
    return f"packs/pack-{name}.{ext}"


def check_ref_count(url: str, paths) -> list[str]:
    """The refs/ paths of a listing, refused before any is read when there are too many."""
    refs = [p for p in paths if p.startswith("refs/")]
    if len(refs) > MAX_REMOTE_REFS:
        raise RemoteError(f"{url} has {len(refs)} refs, more than wvc reads ({MAX_REMOTE_REFS}); delete old "
                          "branches there (`wvc push --delete REMOTE BRANCH`)")
    return refs


def parse_refs(files: dict[str, bytes]) -> dict[str, str]:
    """refs/... file contents -> validated {ref: commit id}."""
    if len(files) > MAX_REMOTE_REFS:
        raise RemoteError(f"remote has more than {MAX_REMOTE_REFS} refs")
    refs = {}
    for path, data in files.items():
        kind, _, name = path.partition("/")[2].partition("/")
        if not path.startswith("refs/") or kind not in ("heads", "tags"):
            continue
        check_ref_name(name, "remote ref")
        value = data.strip().decode("ascii", "replace")
        if len(data) > MAX_REF_BYTES or not ids.is_object_id(value):
            raise RemoteError(f"remote ref {path} does not hold a commit id")
        refs[path] = value
    return refs


class Remote:
    """A backend: small-file reads, whole and ranged pack reads, and atomic publish."""

    url: str
    bytes_downloaded: int = 0
    bytes_uploaded: int = 0
    bytes_copied: int = 0  # server-side copies compose made (no byte crossed the network)

    def state(self) -> RemoteState:
        raise NotImplementedError

    def read_ref(self, ref: str) -> str | None:
        """One ref's commit with one small read (a follower's poll), validated; None when the
        remote has no such ref. Not pinned to a listing: a poll needs only this."""
        check_ref_name(ref.split("/", 2)[-1], "remote ref")
        data = self.read(ref, MAX_REF_BYTES + 1)
        if data is None:
            return None
        value = data.strip().decode("ascii", "replace")
        if len(data) > MAX_REF_BYTES or not ids.is_object_id(value):
            raise RemoteError(f"remote ref {ref} does not hold a commit id")
        return value

    def read(self, path: str, limit: int) -> bytes | None:
        """A small file (None if absent), refusing more than ``limit`` bytes."""
        raise NotImplementedError

    def download(self, path: str, dest: Path, limit: int) -> None:
        """A file to ``dest`` (packs), refusing more than ``limit`` bytes."""
        raise NotImplementedError

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes of a file from ``offset`` (streaming reads into packs)."""
        raise NotImplementedError

    # Whether publish can delete files in the same atomic step (the Hub: one commit). Other
    # backends retire replaced files and delete them after a grace period (remotes/compaction.py).
    deletes_atomically = False

    def publish(self, files: dict[str, Path | bytes], refs: dict[str, str | None], expected: RemoteState,
                message: str, delete: tuple[str, ...] = (), progress=None) -> None:
        """Upload ``files``, then set ``refs`` (None deletes) iff the remote is still ``expected``;
        ``delete`` (only where ``deletes_atomically``) goes in the same step; ``progress``
        (a wvc.progress.Progress) is told the bytes uploaded."""
        raise NotImplementedError

    def delete(self, paths: list[str]) -> None:
        """Remove files (retired ones, after their grace period); absent ones are no error."""
        raise NotImplementedError

    # Whether retired packs and catalogs move to the attic (``attic_path``), out of what
    # ``state`` lists. Such a backend's reads of a ``movable`` path that is gone look in the
    # attic, so a reader pinned to a listing from before the move still finds every file.
    moves_retired = False

    def move_to_attic(self, paths: list[str]) -> None:
        """Move retired ``movable`` files into the attic (a file already moved, or absent, is
        no error). Only a move that completes hides a file: one the backend cannot move
        stays where it is, retired by its record all the same."""
        raise NotImplementedError

    def attic_names(self, folder: str) -> list[str]:
        """The names of the files in ``attic/<folder>/`` (the purge's list of moved records)."""
        raise NotImplementedError

    # Whether the backend can build a file from byte ranges of files it holds, without the
    # client sending them (a directory: a copy on its file system). Compaction then sends
    # only what the remote does not have (remotes/compaction.py, ``Recipe``).
    composes = False

    def compose(self, path: str, pieces: list, expected: tuple[str, int], local: Path) -> int | None:
        """Write ``path`` (absent from the listing: an immutable, content-named file) as the
        concatenation of ``pieces``: ``(source path, offset, length)`` ranges of files the
        remote holds, or ``bytes`` the client sends; ``expected``: (blake3 PACK checksum of all
        but the trailer, size), checked before it becomes visible; ``local``: the same file as
        the client built it, for ranges the backend cannot copy (too small to be a part of
        their own). Returns the bytes sent, or None when composing would save nothing here
        (the caller then uploads ``local`` as usual)."""
        raise NotImplementedError
