"""The remote repository: wvc's remote format over a backend's plain files.

A backend (``interface.Backend``: a directory, the Hub, S3) knows files only. This layer
alone knows what they mean: catalogs and segments (remotes/catalog.py), format-1 commit,
tree and index files, the base record, retired records and compaction (its private
policy, remotes/compaction.py), and what the refs reach. It is built once per operation
from one listing of the remote (``RemoteRepository.open``) and every read of that
operation is pinned to it: a clone, a fetch or a lazy read lists the remote once.

Nothing a remote sends is trusted: every file is bounded when read, every catalog and
index parsed with its sizes checked, every commit and tree verified against its id here,
before a caller sees it (restic's ``repository`` over its ``Backend``; dulwich's object
store over its transport).
"""

from __future__ import annotations

import functools
import json
import logging
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import ids
from ..model import tree_diff
from ..errors import CorruptObject, NotAWvcRemote, RemoteError, RemoteNotFound, WvcError
from ..formats import bounded_json
from ..fsutil import atomic_write
from ..lru import LRUCache
from ..model.versions import Commit, Tree
from ..store.chains import close_over_bases
from ..store.packs import MAX_INDEX_BYTES, PackEntry, parse_index
from . import compaction
from .catalog import MAX_CATALOG_BYTES, Catalog, catalog_name, parse_catalog, segment_size
from . import layout
from .interface import MAX_BASE_RECORD, MAX_PACK_BYTES, MAX_PRUNED_RECORD, MAX_SMALL_OBJECT, Backend, Handle, Listing
from .layout import (BASE_RECORD, catalog_path, commit_of_step_path, movable, new_record_name, pack_path,
                     pruned_path, step_path)

log = logging.getLogger(__name__)

MAX_RETIRED_RECORD = 16 << 20
PARSED_TREES = tree_diff.MAX_DELTA_DEPTH + 8  # verified trees an operation keeps: a chain's worth
PARSED_CACHE_BYTES = 256 << 20  # parsed catalogs a process keeps (what they hold in memory, about)


# Catalogs already parsed in this process, by name (a name is the hash of the bytes, so a hit
# is the same verified catalog): a process that pushes or follows every step (the Publisher, a
# follower) parsed every catalog of the remote again at each operation, most of a push's time
# late in a long run. Bounded by what the catalogs hold in memory.
PARSED_CATALOGS: LRUCache[str, Catalog] = LRUCache(PARSED_CACHE_BYTES, weight=lambda cat: cat.held_bytes)


class _MergedIndexes:
    """The object index and the commits and trees over a listing's segments, kept per remote
    and brought up to date from the last listing's: a push or a follower every step rebuilt
    them from every segment, which made each push cost more the longer the history (a copy of
    the last dicts is ~10x cheaper than merging every segment's again). Each call returns new
    dicts, so no earlier listing's contents change. Built from scratch when a segment that
    went away held something no new segment holds (gc, prune)."""

    KEEP = 4  # remotes

    def __init__(self):
        self.last: LRUCache[str, tuple] = LRUCache(self.KEEP)  # url -> the last listing's segments and dicts

    def build(self, url: str, segments: list) -> tuple[dict, dict, dict]:
        keyed = {(seg.catalog, seg.pack): seg for seg in segments}
        last = self.last.get(url)
        made = self._update(last, keyed) if last is not None else None
        if made is None:
            made = self._scratch(segments)
        self.last.put(url, (keyed, *made))
        return made

    @staticmethod
    def _scratch(segments) -> tuple[dict, dict, dict]:
        index: dict[str, tuple[str, PackEntry]] = {}
        commits: dict[str, bytes] = {}
        trees: dict[str, bytes] = {}
        for seg in reversed(segments):  # (the first segment listing an object names it: as setdefault would)
            index.update(seg.located)
        for seg in segments:
            commits.update(seg.commits)
            tree_diff.merge_forms(trees, seg.trees)
        return index, commits, trees

    @staticmethod
    def _update(last, keyed: dict):
        was, index, commits, trees = last
        gone = [seg for key, seg in was.items() if key not in keyed]
        new = [seg for key, seg in keyed.items() if key not in was]
        if len(gone) + len(new) > len(keyed):  # (mostly new: as cheap to build it again)
            return None
        index, commits, trees = dict(index), dict(commits), dict(trees)
        lost: set[str] = set()
        for seg in gone:
            for oid in seg.located:
                if index.get(oid, (None,))[0] == seg.pack:
                    del index[oid]
                    lost.add(oid)
            for cid in seg.commits:
                commits.pop(cid, None)
                lost.add(cid)
            for tid in seg.trees:
                trees.pop(tid, None)
                lost.add(tid)
        for seg in new:
            for oid, where in seg.located.items():
                index.setdefault(oid, where)
            commits.update(seg.commits)
            tree_diff.merge_forms(trees, seg.trees)
        if any(x not in index and x not in commits and x not in trees for x in lost):
            return None  # held only by what went away, or by a segment that stayed: build again
        return index, commits, trees


MERGED_INDEXES = _MergedIndexes()
# catalog name -> its Segment, while PARSED_CATALOGS keeps the catalog (which holds it): one
# lookup a listed catalog instead of the parsed-catalog cache's
LISTED_SEGMENTS: "weakref.WeakValueDictionary[str, Segment]" = weakref.WeakValueDictionary()
# retired/ records read in this process, by (remote, record): a record is written once under
# a fresh name (time and random), and a pusher or follower lists the same ones for an hour
RETIRED_SEEN: LRUCache[tuple[str, str], list[str]] = LRUCache(100_000)


@dataclass
class Segment:
    """What one push (or one compaction) left on a remote: a pack and what describes it."""
    catalog: str | None  # format 2: the catalog's name; None for a format-1 pack (.idx)
    pack: str | None
    entries: list[PackEntry]
    commits: dict[str, bytes]
    trees: dict[str, bytes]

    @property
    def pack_bytes(self) -> int:
        return sum(e.length for e in self.entries)

    @functools.cached_property  # (compaction asks for every segment's size at every push)
    def size(self) -> int:
        """What rewriting the segment costs: its payloads, commits and trees."""
        return segment_size(self.entries, self.commits, self.trees)

    @functools.cached_property
    def located(self) -> dict[str, tuple[str | None, PackEntry]]:
        """id -> (pack, entry): this segment's part of RemoteContents.index. Segments are
        built anew per listing, so a segment's catalog keeps it (``Catalog.located``)."""
        return {e.id: (self.pack, e) for e in self.entries}

    @functools.cached_property
    def ids(self) -> frozenset:
        return frozenset(self.located)

    @functools.cached_property  # (a push asks it of every listed segment)
    def files(self) -> tuple[str, ...]:
        out = [catalog_path(self.catalog)] if self.catalog else []
        if self.pack:
            out.append(pack_path(self.pack))
            if self.catalog is None:
                out.append(pack_path(self.pack, "idx"))
        return tuple(out)

    def only(self, objects: set[str], commits: set[str], trees: set[str]) -> "Segment":
        """The segment with only the given objects, commits and trees (what gc keeps)."""
        return Segment(self.catalog, self.pack, [e for e in self.entries if e.id in objects],
                       {c: d for c, d in self.commits.items() if c in commits},
                       {t: d for t, d in self.trees.items() if t in trees})


@dataclass
class RemoteContents:
    """Everything a remote's catalogs and indexes say, read in one pass (a request a file)."""
    segments: list[Segment]
    index: dict[str, tuple[str, PackEntry]]  # object id -> (pack, entry), over every segment
    commits: dict[str, bytes]  # canonical bytes, unverified: RemoteRepository.commit verifies
    trees: dict[str, bytes]
    retired_records: dict[str, list[str]] = field(default_factory=dict)  # record -> the files it retires
    pruned: set[str] = field(default_factory=set)  # commits whose weights `prune --remote` dropped (pruned/ records)

    @functools.cached_property  # (contents are one listing's: a push asks several times)
    def retired(self) -> set[str]:
        """Every file a retired record lists (compaction.py)."""
        return {p for paths in self.retired_records.values() for p in paths}

    @functools.cached_property
    def live_segments(self) -> list[Segment]:
        """Segments no retired record lists: what a push may rely on and compaction may merge
        (a retired one is still read until it is deleted, but nothing new builds on it)."""
        retired = self.retired
        return [s for s in self.segments if retired.isdisjoint(s.files)]


def _segment_of(name: str, cat: Catalog) -> Segment:
    seg = Segment(name, cat.pack, cat.entries, cat.commits, cat.trees)
    seg.__dict__["located"] = {e.id: (cat.pack, e) for e in cat.entries}
    seg.__dict__["ids"], seg.__dict__["size"] = frozenset(seg.located), cat.size
    return seg


def verified(parse, data: bytes, expected: str, what: str):
    """A commit or tree a remote sent, parsed and checked against the id it was asked for."""
    try:
        return parse(data, expected_id=expected)
    except WvcError as exc:
        raise CorruptObject(f"remote {what} {ids.short(expected)} is corrupt: {exc}") from exc


@dataclass
class RemoteState(Listing):
    """A listing as the remote repository reads it (``RemoteRepository.open``): its files
    sorted by kind (``layout.sorted_listing``) and the base record."""
    packs: list[str] = field(default_factory=list)  # names of packs with a format-1 .idx
    base: bytes | None = None  # base.json as stored (untrusted: basemodel/base_ref.py parses it)
    catalogs: list[str] = field(default_factory=list)  # format 2: one a segment (remotes/catalog.py)
    retired: list[str] = field(default_factory=list)  # retired/ records: files compaction replaced
    pruned: list[str] = field(default_factory=list)  # pruned/ records: commits whose weights `prune --remote` dropped


def read_state(backend: Backend, create: bool = False) -> RemoteState:
    """One listing of ``backend``, read as the format sees it: whether it is a wvc remote
    (``create``: a push's, which makes an empty one one), its files sorted by kind and the
    base record (read only when listed)."""
    if create and backend.read_only:
        raise RemoteError(backend.read_only)
    try:
        listing = backend.listing()
    except RemoteNotFound:
        if not create:
            raise
        backend.make()
        listing = backend.listing()
    listing = _a_wvc_remote(backend, listing, create)
    base = backend.read(Handle("base"), MAX_BASE_RECORD) if layout.BASE_RECORD in listing.files else None
    named = layout.sorted_listing(listing.files)
    return RemoteState(listing.refs, listing.version, listing.files, listing.tokens, packs=named["idx"], base=base,
                       catalogs=named["catalog"], retired=named["retired"], pruned=named["pruned"])


def _a_wvc_remote(backend: Backend, listing: Listing, create: bool) -> Listing:
    """``listing`` if it is a wvc remote's (or, for a push, one made so), else the one line
    that says it is not. A directory or S3 prefix is one by its marker, made by the first push
    into an empty one; a Hub repository or a bucket by its files: holding files, none of them
    wvc's (a Hub repository's starter files aside), it is someone else's model."""
    paths = listing.files
    if backend.keeps_marker:
        if layout.MARKER in paths:
            return listing
        if not create:
            raise RemoteError(f"{backend.url} is not a wvc remote (no {layout.MARKER})")
        if paths:
            raise RemoteError(f"{backend.url} exists and is not a wvc remote (it holds {', '.join(sorted(paths)[:4])})")
        backend.write_new(Handle("marker"), json.dumps({"format": layout.FORMAT}).encode())  # the bytes wvc always wrote
        return replace(listing, files=frozenset({layout.MARKER}))
    if not layout.is_wvc_layout(paths) and any(p not in layout.HUB_STARTERS for p in paths):
        raise not_a_wvc_remote(backend.url, paths, "push" if create else "read")
    return listing


def read_branch_tip(backend: Backend, branch: str) -> str | None:
    """The commit ``branch`` points at on the remote, read with one small request and
    validated, not pinned to a listing (a follower's poll, a trainer's check before it
    pushes); None when there is no such branch."""
    from ..store.refs import HEADS

    return backend.read_ref(HEADS + branch)


def holds_a_wvc_remote(paths) -> bool:
    """Whether a listing of files (a Hub repository's, say) holds any wvc remote state: a
    repository to clone, not a model's files."""
    return layout.is_wvc_layout(paths)


def is_directory_remote(root: Path) -> bool:
    """Whether the directory ``root`` is a wvc remote (its marker file is there)."""
    return (root / layout.MARKER).is_file()


def not_a_wvc_remote(url: str, paths, verb: str) -> NotAWvcRemote:
    """The one line for a remote that holds other content and no wvc history."""
    shown = sorted(p for p in paths if p not in layout.HUB_STARTERS)
    listed = ", ".join(shown[:4]) + (f" and {len(shown) - 4} more" if len(shown) > 4 else "")
    if verb == "push":
        return NotAWvcRemote(f"{url} is not a wvc remote: it already holds {listed}; wvc will not write into it. "
                             "Push to a new repository (e.g. add a remote hf://ORG/NAME-wvc), or to version a "
                             f"fine-tune of this model: `wvc init --base {url}`")
    return NotAWvcRemote(f"{url} is not a wvc remote (it holds {listed}); to start a history from this model "
                         f"use `wvc init --base {url}`")


class RemoteRepository:
    """One remote, as wvc's format sees it, pinned to one listing (``state``).

    ``cache_dir``: where immutable files (catalogs, format-1 pack indexes) are kept once
    read and validated, so a later operation reads each only once."""

    def __init__(self, backend: Backend, state: RemoteState, cache_dir: Path | None = None):
        self.backend = backend
        self.state = state
        self.cache_dir = cache_dir
        self._contents: RemoteContents | None = None
        self._commits: dict[str, tuple[Commit, bytes]] = {}  # verified, with the bytes they came as
        # verified trees, newest last: reading a history in order resolves each tree delta
        # (model/tree_diff.py) from the tree before it, not from the chain's whole tree
        self._trees: LRUCache[str, Tree] = LRUCache(PARSED_TREES)

    @classmethod
    def open(cls, backend: Backend, cache_dir: Path | None = None, *, create: bool = False) -> "RemoteRepository":
        """List ``backend`` once (``create``: make it a wvc remote if it is empty)."""
        return cls(backend, read_state(backend, create), cache_dir)

    @property
    def url(self) -> str:
        return self.backend.url

    @property
    def refs(self) -> dict[str, str]:
        return self.state.refs

    @property
    def base_record(self) -> bytes | None:
        """base.json as stored (untrusted: basemodel/base_ref.py parses it)."""
        return self.state.base

    @property
    def downloaded_bytes(self) -> int:
        return self.backend.bytes_downloaded

    @property
    def uploaded_bytes(self) -> int:
        return self.backend.bytes_uploaded

    @property
    def copied_bytes(self) -> int:
        """Bytes compaction copied on the remote itself (none crossed the network)."""
        return self.backend.bytes_copied

    def chunks(self, base_chunks=None, *, held=None, keep_keyframe=None):
        """A reader of chunk bytes by range reads into this listing's packs, each verified
        (remotes/downloads.RemoteChunks); ``base_chunks``: the base model's, in no pack."""
        from .downloads import RemoteChunks

        return RemoteChunks(self.backend, self.index, base_chunks, held=held, keep_keyframe=keep_keyframe)

    def delete_step_records(self, paths) -> None:
        """Delete step records (``step_records``'s files) at once: shortcuts to commits no ref
        reaches lead nowhere, so no reader needs them through a grace period. On a backend that
        deletes only in a publish (the Hub), in one commit."""
        if not paths:
            return
        if self.backend.deletes_atomically:
            self.publish({}, {}, f"wvc gc: {len(paths)} step records of unreachable commits", replaced=list(paths))
        else:
            self.backend.delete(layout.handles(paths))

    # -- reading -------------------------------------------------------------------------------
    @property
    def contents(self) -> RemoteContents:
        """Every catalog and format-1 index, read once per operation (and each immutable file
        once per cache)."""
        if self._contents is None:
            self._contents = self._read_contents()
        return self._contents

    @property
    def index(self) -> dict[str, tuple[str, PackEntry]]:
        return self.contents.index

    def commit_bytes(self, cid: str) -> bytes | None:
        """A commit's canonical bytes (unverified) from the catalogs, else its format-1 file."""
        return self.contents.commits.get(cid) or self.loose_commit(cid)

    def download_pack(self, name: str, dest: Path) -> None:
        """Pack ``name`` into the local file ``dest`` (unverified: the caller checks it)."""
        self.backend.download(Handle("pack", name), dest, MAX_PACK_BYTES)

    def loose_commit(self, cid: str) -> bytes | None:
        """Format 1: a commit's own file (unverified), or None."""
        return self.backend.read(Handle("commit", cid), MAX_SMALL_OBJECT)

    def loose_tree(self, tid: str) -> bytes | None:
        """Format 1: a tree's own file (unverified), or None."""
        return self.backend.read(Handle("tree", tid), MAX_SMALL_OBJECT)

    def commit(self, cid: str, missing: str | None = None, absent: type = RemoteError) -> Commit:
        """Commit ``cid``, verified against its id; ``absent(missing)`` when the remote has
        no such commit."""
        return self.verified_commit(cid, missing, absent)[0]

    def verified_commit(self, cid: str, missing: str | None = None, absent: type = RemoteError) -> tuple[Commit, bytes]:
        """Commit ``cid`` and the bytes it came as (what a fetch records), verified."""
        found = self._commits.get(cid)
        if found is None:
            data = self.commit_bytes(cid)
            if data is None:
                raise absent(missing or f"{self.url} is missing commit {ids.short(cid)}")
            found = self._commits[cid] = (verified(Commit.from_bytes, data, cid, "commit"), data)
        return found

    def tree(self, tid: str) -> Tree:
        """Tree ``tid``, verified against its id (a tree delta: every tree of its chain);
        RemoteError when absent."""
        first = None if tid in self._trees else self.stored_tree(tid)  # (a format-1 tree: one request)
        if tid not in self._trees and first is None:
            raise RemoteError(f"{self.url} is missing tree {ids.short(tid)}")
        tree, built = tree_diff.resolve(tid, lambda t: first if t == tid else self.stored_tree(t), self._trees.get,
                                        f"remote {self.url}")
        tree_diff.remember(self._trees, built)
        return tree

    def stored_tree(self, tid: str) -> bytes | None:
        """A tree as the remote stores it (whole, or a delta), unverified; None when absent."""
        return self.contents.trees.get(tid) or self.loose_tree(tid)

    def tree_bases(self, trees: set[str]) -> set[str]:
        """``trees`` with the trees their deltas are read from (what gc must keep with them)."""
        out, stack = set(), list(trees)
        while stack:
            tid = stack.pop()
            if tid in out:
                continue
            out.add(tid)
            data = self.contents.trees.get(tid)
            if data is not None and tree_diff.is_delta(data):
                stack.append(tree_diff.base_of(data, tid))
        return out

    @property
    def pruned(self) -> set[str]:
        """Commits whose weights `prune --remote` dropped, less any a ref points at: a ref
        moved onto one (by a push racing the prune, whose record lands with its files) keeps
        its weights, and the push that moved it sends them (ops/push.py)."""
        return self.contents.pruned - set(self.refs.values())

    def reachable(self, tips=None, pruned: set[str] | None = None, *,
                  closed: bool = True) -> tuple[set[str], set[str], set[str]]:
        """(commits, trees, objects) ``tips`` (default: every ref) reach, objects closed over
        delta bases (``closed``; else the trees' chunks only); each commit and tree verified.
        A missing one is a RemoteError. A pruned commit's tree is reached, its chunks are not
        (``pruned``: default, the remote's own)."""
        pruned = self.pruned if pruned is None else pruned
        commits, trees, weighted, objects = set(), set(), set(), set()
        stack = list(self.refs.values() if tips is None else tips)
        while stack:
            cid = stack.pop()
            if cid in commits:
                continue
            commit = self.commit(cid)
            commits.add(cid)
            stack.extend(commit.parents)
            if commit.tree not in trees:
                trees.add(commit.tree)
            if cid not in pruned and commit.tree not in weighted:
                weighted.add(commit.tree)
                objects |= self.tree(commit.tree).chunk_ids()
        return commits, self.tree_bases(trees), self.closure(objects) if closed else objects

    def closure(self, objects: set[str]) -> set[str]:
        """``objects`` with the delta bases they need that the remote's packs hold."""
        index = self.index

        def base_of(oid: str) -> str | None:
            found = index.get(oid)
            return found[1].base if found is not None else None

        return close_over_bases(objects, base_of)

    def step_records(self) -> dict[str, str]:
        """Every listed step record (remotes/step_records.py), by the commit it leads to:
        commit id -> its file (what ``rewrite`` and ``publish`` take as ``replaced``)."""
        return {c: p for p in self.state.files if (c := commit_of_step_path(p)) is not None}

    def has_file(self, path: str) -> bool:
        """Whether the pinned listing holds ``path``."""
        return path in self.state.files

    def _read_contents(self) -> RemoteContents:
        segments = []
        for name in self.state.catalogs:
            # a catalog parsed once serves every listing of this process: so does its segment,
            # lookups included (a push late in a long run spent most of its time rebuilding
            # them, then a segment per catalog, most of them retired and waiting out the grace
            # hour); nothing changes a listed segment (gc and prune build new ones: ``only``)
            seg = LISTED_SEGMENTS.get(name)
            if seg is None:
                cat = PARSED_CATALOGS.get_or_make(name, lambda n=name: self._immutable(
                    Handle("catalog", n), f"{n}.cat", MAX_CATALOG_BYTES, f"remote catalog {n[:12]}",
                    lambda d: parse_catalog(d, n)))
                seg = LISTED_SEGMENTS[name] = cat.derived(lambda c=cat, n=name: _segment_of(n, c))
            segments.append(seg)
        for name in self.state.packs:
            segments.append(Segment(None, name, self.pack_index(name), {}, {}))
        index, commits, trees = MERGED_INDEXES.build(self.url, segments)
        return RemoteContents(segments, index, commits, trees, self._retired_records(), self._pruned_commits())

    def pack_index(self, name: str) -> list[PackEntry]:
        """A format-1 pack's ``.idx``, validated (cached: packs are immutable)."""
        what = f"remote pack index {name[:12]}"

        def parse(data):
            try:
                return parse_index(data, what)
            except CorruptObject as exc:
                raise RemoteError(str(exc)) from exc

        return self._immutable(Handle("idx", name), f"{name}.idx", MAX_INDEX_BYTES, what, parse)

    def _immutable(self, handle: Handle, cache_name: str, limit: int, what: str, parse):
        """An immutable remote file, parsed (and so validated) by ``parse``; from the cache
        when it is there, kept there once it parsed."""
        cache = self.cache_dir / cache_name if self.cache_dir is not None else None
        if cache is not None and cache.is_file() and cache.stat().st_size <= limit:
            return parse(cache.read_bytes())
        data = self.backend.read(handle, limit)
        if data is None:
            raise RemoteError(f"{what} is missing")
        parsed = parse(data)
        if cache is not None:
            cache.parent.mkdir(exist_ok=True)
            atomic_write(cache, data, durable=False)
        return parsed

    def attic_records(self) -> dict[str, list[str]]:
        """What each record in the attic lists: retirements whose files all moved there."""
        if not self.backend.moves_retired:
            return {}
        names = [r for n in self.backend.attic_names("retired") if (r := layout.record_of_name(n))]
        return self._retired_records(sorted(names))

    def _retired_records(self, names=None) -> dict[str, list[str]]:
        """What each retired/ record listed (remotes/compaction.py), or each of ``names``,
        lists (read from the attic where it moved)."""
        out: dict[str, list[str]] = {}
        for record in self.state.retired if names is None else names:
            known = RETIRED_SEEN.get((self.url, record))
            if known is not None:
                out[record] = known
                continue
            data = self.backend.read(Handle("retired", record), MAX_RETIRED_RECORD)
            if data is None:
                continue  # deleted by a purge since the listing
            try:
                paths = bounded_json.loads(data, f"remote retired record {record}")["paths"]
                if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
                    raise ValueError("paths is not a list of strings")
            except (ValueError, KeyError, TypeError, RecursionError, CorruptObject) as exc:  # (absurd nesting, density)
                raise RemoteError(f"remote retired record {record} is malformed") from exc
            out[record] = paths
            RETIRED_SEEN.put((self.url, record), paths)
        return out

    def _pruned_commits(self) -> set[str]:
        """The commits every pruned/ record lists (normally one record: each prune writes the
        union and replaces the ones it read)."""
        out: set[str] = set()
        for record in self.state.pruned:
            data = self.backend.read(Handle("pruned", record), MAX_PRUNED_RECORD)
            if data is None:
                continue  # replaced by a prune since the listing
            try:
                commits = bounded_json.loads(data, f"remote pruned record {record}")["commits"]
                if not (isinstance(commits, list) and all(isinstance(c, str) and ids.is_object_id(c) for c in commits)):
                    raise ValueError("commits is not a list of commit ids")
            except (ValueError, KeyError, TypeError, RecursionError, CorruptObject) as exc:
                raise RemoteError(f"remote pruned record {record} is malformed") from exc
            out.update(commits)
        return out

    # -- writing -------------------------------------------------------------------------------
    def push_segment(self, pack_file: Path | None, catalog: Catalog, refs: dict[str, str | None], message: str,
                     work_dir: Path, *, base_record: bytes | None = None, progress=None, step_records=None) -> int:
        """Publish one new segment (``pack_file``, None when every chunk is on the remote,
        and its ``catalog``) and move ``refs``, in one compare-and-swap against the pinned
        state. Compaction may merge the segment with others of its tier first (the file
        count stays bounded); files retired long enough ago are purged after. Returns the
        number of files the segment replaced. ``step_records(locate)``: the followers' step
        records (remotes/step_records.py) to publish with it, given where each chunk will be
        (``locate(id)`` -> (pack, entry) or None), and the commits whose records it replaces."""
        from ..progress import NULL

        progress = progress or NULL
        files: dict[str, Path | bytes] = {}
        # nothing new to store (a tag on a commit the remote has): refs only, no empty segment
        nothing = pack_file is None and not catalog.commits
        merging = [] if nothing else compaction.to_merge(self.contents.live_segments, catalog.size)
        replaced: list[str] = []
        composed = False
        if merging:
            progress.start(len(merging), "compacting the remote", unit="segments")
            pack_file, catalog, recipe = compaction.merge_segments(self.download_pack, merging, pack_file, catalog, work_dir)
            replaced = [f for seg in merging for f in seg.files]
            if recipe is not None and self.backend.composes:  # the remote's own bytes are not sent again
                composed = self.backend.compose(Handle("pack", catalog.pack), recipe.pieces, (recipe.checksum, recipe.size),
                                                pack_file) is not None
            progress.close()
        if pack_file is not None and not composed:
            files[pack_path(catalog.pack)] = pack_file
        if not nothing:
            data = catalog.to_bytes()
            files[catalog_path(catalog_name(data))] = data
        if base_record is not None and self.state.base is None:
            files[BASE_RECORD] = base_record
        dropped: list[str] = []
        if step_records is not None:
            records, old = step_records(self._locator(catalog))
            files.update(records)
            dropped = [p for p in map(step_path, old) if p in self.state.files]
        # A step record is only ever a shortcut (a follower that misses one reads the version
        # the usual way), so an old one is deleted at once, not retired for the grace period.
        atomic = self.backend.deletes_atomically
        self.publish(files, refs, message, replaced=replaced + (dropped if atomic else []), progress=progress)
        if dropped and not atomic:
            try:
                self.backend.delete(layout.handles(dropped))
            except RemoteError as exc:  # (left behind: harmless, listed until `gc --remote`)
                log.debug("%s: replaced step records not deleted (%s)", self.url, exc)
        self.purge()
        return len(replaced)

    def _locator(self, catalog: Catalog, without=frozenset()):
        """Where each chunk is once ``catalog``'s segment is published: in it, else in a live
        segment (a retired one may be deleted while a follower reads), not one of the packs
        ``without`` (those it replaces)."""
        mine = {e.id: (catalog.pack, e) for e in catalog.entries}
        live = {seg.pack for seg in self.contents.live_segments if seg.pack is not None} - set(without)
        index = self.index

        def locate(oid: str):
            found = mine.get(oid) or index.get(oid)
            return found if found is not None and (found[0] == catalog.pack or found[0] in live) else None
        return locate

    def rewrite(self, dropped: list[Segment], kept: list[Segment], message: str, work_dir: Path, progress=None, *,
                pruned: set[str] | None = None, step_records=(), new: tuple[Path, Catalog] | None = None,
                rebuilt_records=None) -> None:
        """Replace ``dropped`` segments by one holding ``kept`` (segments cut down to what
        stays: Segment.only), refs unchanged, by compare-and-swap (``gc --remote``, ``prune
        --remote``). ``pruned``: every commit whose weights the remote no longer holds (prune):
        one new pruned/ record lists them all and replaces the records read. ``step_records``:
        step records to delete with it (in its commit where the backend deletes atomically, else
        right after it). ``new``: a local pack and its catalog of payloads the segment holds too
        (a prune's re-encoded chunks: remotes/rebase_plan.py). ``rebuilt_records(locate,
        dropped_packs)``: path -> step record, built again where one names a pack no longer
        live after this (remotes/step_record_writer.after_rewrite); ``locate`` as push_segment's."""
        from ..model.versions import canonical_json
        from ..progress import NULL

        progress = progress or NULL
        files: dict[str, Path | bytes] = {}
        atomic = self.backend.deletes_atomically
        replaced = list(step_records) if atomic else []
        if pruned is not None:
            files[pruned_path(new_record_name())] = canonical_json({"commits": sorted(pruned)})
            replaced += [pruned_path(r) for r in self.state.pruned]
        catalog = Catalog(None)
        if kept or new is not None:
            progress.start(len(kept), "rewriting remote packs", unit="segments")
            new_pack, new_catalog = new if new is not None else (None, Catalog(None))
            pack_file, catalog, recipe = compaction.merge_segments(self.download_pack, kept, new_pack, new_catalog,
                                                                   work_dir)
            if recipe is not None and self.backend.composes and self.backend.compose(
                    Handle("pack", catalog.pack), recipe.pieces, (recipe.checksum, recipe.size), pack_file) is not None:
                pack_file = None
            progress.close()
            if pack_file is not None:
                files[pack_path(catalog.pack)] = pack_file
            data = catalog.to_bytes()
            files[catalog_path(catalog_name(data))] = data
        if rebuilt_records is not None:
            dropped_packs = {seg.pack for seg in dropped}
            records = rebuilt_records(self._locator(catalog, without=dropped_packs), dropped_packs)
            again = [p for p in records if p in self.state.files]
            if again and not atomic:  # (a backend keeps an object that exists: the old record goes first)
                self.backend.delete(layout.handles(again))
            files.update(records)
        self.publish(files, {}, message, replaced=[f for seg in dropped for f in seg.files] + replaced)
        if step_records and not atomic:
            self.backend.delete(layout.handles(step_records))

    def publish(self, files: dict[str, Path | bytes], refs: dict[str, str | None], message: str, *,
                replaced=(), progress=None) -> None:
        """``files`` uploaded, then ``refs`` moved (None deletes), iff the remote is still as
        pinned. ``replaced``: files this makes redundant, deleted in the same step where the
        backend can (the Hub's one commit), else retired (compaction.py) and purged later."""
        files, delete, record_path = dict(files), (), None
        if replaced and self.backend.deletes_atomically:
            delete = tuple(layout.handles(replaced))
        elif replaced:
            record_path, record = compaction.retired_record(list(replaced))
            files[record_path] = record
        files = dict(zip(layout.handles(files), files.values()))  # (the backend is given handles, never paths)
        self.backend.publish(files, refs, self.state, message, delete=delete, progress=progress)
        if record_path is not None:
            compaction.retired_at(self.url, record_path)
            self._move_to_attic(list(replaced), record_path)

    def _move_to_attic(self, retired: list[str], record: str | None = None) -> None:
        """Retired files out of the listed folders, then ``record`` (which names them), where
        the backend can move them. Published first: the record, not the move, is what retires
        a file, so a move that fails or never happens leaves files that are listed and still
        retired (the record stays listed with them); the next push's purge moves them."""
        if not self.backend.moves_retired:
            return
        try:
            self.backend.move_to_attic(layout.handles([p for p in retired if movable(p)]))
            if record is not None:
                self.backend.move_to_attic(layout.handles([record]))
        except (RemoteError, OSError) as exc:  # (the push has landed: the files stay where they are, retired all the same)
            log.debug("%s: retired files left in place (%s)", self.url, exc)

    def purge(self) -> int:
        """Delete what retired records older than the grace period list, when nothing the
        refs reach still needs it; the number of files deleted. Retired files still listed
        (a push that stopped before moving them) go to the attic first."""
        if self.backend.deletes_atomically:
            return 0
        if self.backend.moves_retired:
            if left := sorted(self.contents.retired & self.state.files):
                self._move_to_attic(left)
            if not (self.state.retired or compaction.purge_due(self.url)):
                return 0
        elif not self.state.retired:
            return 0
        purge = compaction.purge_plan(self)
        if purge is None:
            return 0
        self.backend.delete(layout.handles(purge.listed))
        self.backend.delete(layout.handles(purge.attic), in_attic=True)
        compaction.purged(self.url, purge)
        return len(purge.paths)
