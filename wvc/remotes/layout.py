"""The layout map: every path of a remote is built and recognised here, and nowhere else.

    wvc.json                              {"format": 1} (the marker)
    base.json                             the base model, if any: {"url", "tree", "commit"} (basemodel/base_ref.py)
    refs/heads/<branch>, refs/tags/<tag>  the only mutable files: a commit id and a newline
    packs/pack-<hex>.pack                 immutable packs (store/packs.py), named by checksum
    catalogs/<hex>.cat                    format 2: a segment's catalog (remotes/catalog.py)
    retired/<time>-<16 hex>.json          files compaction, gc or prune replaced (remotes/compaction.py)
    pruned/<time>-<16 hex>.json           commits whose weights `prune --remote` dropped
    steps/<commit id>.step                a follower's step record (remotes/step_records.py)
    attic/<path>                          retired files moved out of the listing (``Backend.moves_retired``)
    reflog/<seq>-<nonce>.json|.ok         a Storage Bucket's ref log (remotes/bucket.py: its refs' compare-and-swap)
    packs/pack-<hex>.idx                  format 1: a pack's index
    objects/commits/<2 hex>/<id>          format 1: immutable commit objects (canonical bytes)
    objects/trees/<2 hex>/<id>            format 1: immutable tree objects

A backend (``remotes/interface.Backend``) lists, reads and writes these as plain files; the
remote repository (``remotes/repository.py``) is the one reader of what a listing means
(:func:`sorted_listing`). Every name read from a remote is matched whole here before use.
"""

from __future__ import annotations

import re
import secrets
import time

from .. import ids
from ..errors import RemoteError
from ..store.refs import REFS, check_ref_name
from .interface import Handle

FORMAT = 1
MARKER = "wvc.json"
BASE_RECORD = "base.json"
PACKS, CATALOGS, RETIRED, PRUNED, STEPS, OBJECTS = "packs/", "catalogs/", "retired/", "pruned/", "steps/", "objects/"
# Where a backend that can move files keeps what compaction (or gc, or prune) replaced while it
# waits out the grace period, and the retired/ record naming it once every file moved: out of
# the folders every push lists, so a push's listing holds the live segments (O(log pushes)),
# not every segment and record of the last hour. A reader that listed such a file before it
# moved reads it here instead.
ATTIC = "attic/"
REFLOG = "reflog/"  # a Storage Bucket has no commits: its refs move through a log (remotes/bucket.py)
MOVABLE = (PACKS, CATALOGS, PRUNED, RETIRED)
# Folders a backend that lists folder by folder (a directory) lists; the rest are read by name.
LISTED_FOLDERS = (PACKS, CATALOGS, RETIRED, PRUNED, STEPS)

MAX_REF_BYTES = 200
# Each ref is a file read per listing (a GET on the Hub) and a row in a clone's database: a
# remote with 100,000 branches made a clone take 98 s. Runs make branches (run/<name>), so
# the bound is generous; past it, `wvc push --delete` or `gc --remote` is the way back.
MAX_REMOTE_REFS = 10_000

_PACK = re.compile(r"^pack-([0-9a-f]{64})\.(pack|idx)$")
_CATALOG = re.compile(r"^catalogs/([0-9a-f]{64})\.cat$")
_RECORD = r"([0-9]{10}-[0-9a-f]{16})\.json$"  # a retired/ or pruned/ record's file name
_RECORD_NAME, _RETIRED, _PRUNED = (re.compile("^" + folder + _RECORD) for folder in ("", RETIRED, PRUNED))
_STEP_SUFFIX = ".step"


# -- building paths ----------------------------------------------------------------------------
def pack_path(name: str, ext: str = "pack") -> str:
    return f"{PACKS}pack-{name}.{ext}"


def catalog_path(name: str) -> str:
    return f"{CATALOGS}{name}.cat"


def commit_path(cid: str) -> str:
    """Format 1: one file a commit."""
    return f"{OBJECTS}commits/{cid[:2]}/{cid}"


def tree_path(tid: str) -> str:
    """Format 1: one file a tree."""
    return f"{OBJECTS}trees/{tid[:2]}/{tid}"


def step_path(commit_id: str) -> str:
    return f"{STEPS}{commit_id}{_STEP_SUFFIX}"


def new_record_name(now: float | None = None) -> str:
    """A fresh retired/ or pruned/ record name: its unix time (what the grace period is
    counted from) and 16 random hex digits (two writers never collide)."""
    return f"{int(time.time() if now is None else now):010d}-{secrets.token_hex(8)}"


def retired_path(record: str) -> str:
    return f"{RETIRED}{record}.json"


def pruned_path(record: str) -> str:
    return f"{PRUNED}{record}.json"


def record_time(record: str) -> float:
    """When a retired/ or pruned/ record (its name, or its path) was written."""
    return float(record.rpartition("/")[2].split("-")[0])


def attic_path(path: str) -> str:
    """Where a retired file (or a record whose files all moved) waits out the grace period."""
    return ATTIC + path


def movable(path: str) -> bool:
    """Whether ``path`` moves to the attic when it is retired (and is looked for there)."""
    return path.startswith(MOVABLE)


# -- recognising paths -------------------------------------------------------------------------
def commit_of_step_path(path: str) -> str | None:
    """The commit a listed ``steps/`` file is the record of (None: not a record's name)."""
    if path.startswith(STEPS) and path.endswith(_STEP_SUFFIX) and ids.is_object_id(path[len(STEPS):-len(_STEP_SUFFIX)]):
        return path[len(STEPS):-len(_STEP_SUFFIX)]
    return None


def record_of_name(name: str) -> str | None:
    """The record a file name in retired/ or pruned/ (or the attic's) names; None otherwise."""
    m = _RECORD_NAME.match(name)
    return m.group(1) if m else None


_LISTED: dict[str, tuple[str, str] | None] = {}  # path -> (kind, name) or None: _listed's parse, memoised
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
    if found is None and path.startswith(PACKS) and (m := _PACK.match(path.rpartition("/")[2])) and m.group(2) == "idx":
        found = ("idx", m.group(1))
    if len(_LISTED) >= _LISTED_MAX:  # (a memo of a pure function: dropping it all costs a parse each)
        _LISTED.clear()
    _LISTED[path] = found
    return found


def sorted_listing(paths) -> dict[str, list[str]]:
    """A listing's names by kind: ``catalog``, ``retired``, ``pruned`` and ``idx`` (format-1
    packs), each sorted; paths of no kind are left out."""
    named: dict[str, list[str]] = {"catalog": [], "retired": [], "pruned": [], "idx": []}
    for p in paths:
        if (found := _listed(p)) is not None:
            named[found[0]].append(found[1])
    return {kind: sorted(set(names)) for kind, names in named.items()}


# What a wvc remote holds at its top level; on the Hub also the files every repository
# starts with. Anything else is someone else's content.
WVC_TOP = (MARKER, BASE_RECORD, REFS, PACKS, CATALOGS, RETIRED, PRUNED, STEPS, OBJECTS, ATTIC)
HUB_STARTERS = (".gitattributes", "README.md")


def is_wvc_layout(paths) -> bool:
    """Whether a listing holds any wvc state (a marker, refs, packs or catalogs)."""
    return any(p == t or (t.endswith("/") and p.startswith(t)) for p in paths for t in WVC_TOP)


# -- refs --------------------------------------------------------------------------------------
def check_ref_count(url: str, paths) -> list[str]:
    """The refs/ paths of a listing, refused before any is read when there are too many."""
    refs = [p for p in paths if p.startswith(REFS)]
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
        if not path.startswith(REFS) or kind not in ("heads", "tags"):
            continue
        check_ref_name(name, "remote ref")
        value = data.strip().decode("ascii", "replace")
        if len(data) > MAX_REF_BYTES or not ids.is_object_id(value):
            raise RemoteError(f"remote ref {path} does not hold a commit id")
        refs[path] = value
    return refs


# -- handles: a file by what it is --------------------------------------------------------------
_BUILDERS = {"marker": lambda _: MARKER, "base": lambda _: BASE_RECORD, "ref": lambda n: REFS + n,
             "pack": pack_path, "idx": lambda n: pack_path(n, "idx"), "catalog": catalog_path,
             "retired": retired_path, "pruned": pruned_path, "step": step_path, "commit": commit_path,
             "tree": tree_path}
_FOLDERS = {"pack": PACKS, "idx": PACKS, "catalog": CATALOGS, "retired": RETIRED, "pruned": PRUNED, "step": STEPS}
MOVABLE_KINDS = tuple(kind for kind, folder in _FOLDERS.items() if folder in MOVABLE)  # MOVABLE's files
_OBJECT = re.compile(r"^objects/(commits|trees)/([0-9a-f]{2})/([0-9a-f]{64})$")


def path(handle: Handle) -> str:
    """Where ``handle``'s file is on the remote."""
    try:
        return _BUILDERS[handle.kind](handle.name)
    except KeyError:
        raise ValueError(f"no file kind {handle.kind!r}") from None


def handle_of(path: str) -> Handle | None:
    """The handle of a remote path (a listed file, or one a retired record names); None for a
    file that is not wvc's."""
    if path == MARKER:
        return Handle("marker")
    if path == BASE_RECORD:
        return Handle("base")
    if path.startswith(REFS):
        return Handle("ref", path[len(REFS):])
    if path.startswith(PACKS) and (m := _PACK.match(path[len(PACKS):])):
        return Handle(m.group(2), m.group(1))
    if (commit := commit_of_step_path(path)) is not None:
        return Handle("step", commit)
    if (found := _listed(path)) is not None:
        return Handle(*found)
    if (m := _OBJECT.match(path)) and m.group(3).startswith(m.group(2)):
        return Handle(m.group(1)[:-1], m.group(3))
    return None


def handles(paths) -> list[Handle]:
    """The handles of remote paths the remote repository holds (listed, or named by its own
    records); one that is not a wvc file is refused."""
    out = []
    for p in paths:
        if (h := handle_of(p)) is None:
            raise RemoteError(f"{p!r} is not a file of a wvc remote")
        out.append(h)
    return out


class RemoteLayout:
    """The layout map as a backend is given it when it is made (``open_backend`` passes
    ``LAYOUT``; restic's backends get theirs the same way): which listed files are refs and how
    many of them a listing may read, which folders a backend that lists folder by folder lists,
    where a retired file waits out the grace period (the attic), and a Storage Bucket's ref log.
    A backend imports no rule of the format; it asks this."""

    refs = REFS
    attic = ATTIC
    reflog = REFLOG
    listed_folders = LISTED_FOLDERS
    top_level = WVC_TOP  # what a wvc remote holds at its top level (a directory lists the rest as someone else's)
    max_ref_bytes = MAX_REF_BYTES
    path = staticmethod(path)
    check_ref_count = staticmethod(check_ref_count)
    parse_refs = staticmethod(parse_refs)

    @staticmethod
    def movable(handle: Handle) -> bool:
        """Whether ``handle``'s file moves to the attic when it is retired (and is looked for there)."""
        return handle.kind in MOVABLE_KINDS

    @staticmethod
    def attic_path(handle: Handle) -> str:
        """Where ``handle``'s file waits out the grace period once it moved."""
        return attic_path(path(handle))

    @staticmethod
    def attic_folder(kind: str) -> str:
        """The attic's folder of a kind's files (``attic/retired/``)."""
        return attic_path(_FOLDERS[kind])


LAYOUT = RemoteLayout()
