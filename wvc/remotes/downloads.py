"""What crosses from a remote into a repository: streamed verification of downloaded
packs, range fetches of single objects, and chunk reads for remote views. What the remote's
files mean (catalogs, indexes, segments) is remotes/repository.py's.

Nothing a remote sends is trusted: a pack's index (embedded or ``.idx``) is parsed with
every size bounded (store/packs.py) before anything is allocated; every object is decoded
and hash-checked before a row names it. Verification streams: objects are decoded one
chain at a time (store/chains.py) and only delta bases are kept, in a cache bounded in
bytes, so a clone's memory does not grow with the model.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import ids
from ..lru import LRUCache
from ..errors import CorruptObject, MissingObject, RemoteError, WvcError
from ..fsutil import fsync_dir, make_work_dir, sweep_work_dirs
from ..progress import NULL, Progress
from ..store.chains import decode_links, resolve_chain
from ..store.chunks import ObjectStore
from ..store.rows import ObjectRow
from ..store.packs import PackEntry, PackWriter, copy_payloads, pack_filename, read_pack_index, read_payload
from .interface import Backend, Handle
VERIFY_CACHE_BYTES = 16 << 20  # decoded delta bases kept while verifying a fetch
VIEW_CACHE_BYTES = 64 << 20  # decoded chunks a remote view keeps
COALESCE_GAP = 256 << 10  # a range fetch reads through gaps up to this size rather than open another request
MAX_REQUEST = 64 << 20


def decoded_cache(max_bytes: int) -> LRUCache[str, bytes]:
    """Decoded chunks by id, bounded in bytes."""
    return LRUCache(max_bytes, weight=len)


# -- verifying downloaded packs ------------------------------------------------------------------
@dataclass(frozen=True)
class _Link:
    id: str
    base: str | None
    pack: str
    path: Path
    entry: PackEntry

    @property
    def raw_size(self) -> int:
        return self.entry.raw_size


def verify_packs(store: ObjectStore, packs: list[tuple[str, Path]],
                 cache_bytes: int = VERIFY_CACHE_BYTES) -> list[list[ObjectRow]]:
    """Check each downloaded pack's checksum, then decode every object against its id.

    A delta's base may be in the same pack, in another pack of this fetch, or in ``store``.
    Returns each pack's rows (with chain depths) for ObjectStore.insert_rows.
    """
    by_id: dict[str, _Link] = {}
    per_pack = []
    for name, path in packs:
        try:
            checksum, entries = read_pack_index(path)
        except WvcError as exc:
            raise CorruptObject(f"remote pack {name[:12]} is corrupt: {exc}") from exc
        if checksum != name:
            raise CorruptObject(f"remote pack {name[:12]} does not match its name")
        per_pack.append((name, entries))
        for e in entries:
            by_id.setdefault(e.id, _Link(e.id, e.base, name, path, e))
    is_base = {e.base for _, entries in per_pack for e in entries if e.base}
    cache = decoded_cache(cache_bytes)
    depth: dict[str, int] = {}  # every object of this fetch decoded so far
    files: dict[Path, object] = {}

    def payload(link: _Link) -> bytes:
        fh = files.get(link.path)
        if fh is None:
            fh = files[link.path] = open(link.path, "rb")
        return read_payload(fh.fileno(), link.entry.offset, link.entry.length, f"remote pack {link.pack[:12]}")

    def lookup(oid: str) -> _Link:  # stop() has already ended the walk at a local base
        link = by_id.get(oid)
        if link is None:
            raise CorruptObject(f"remote object needs base {ids.short(oid)} that neither side has")
        return link

    def stop(oid: str) -> bool:  # bytes available without decoding further down
        return oid in cache or (oid not in by_id and store.has(oid))

    def raw_of(oid: str) -> bytes:  # a chunk of this fetch or of the store, decoded again if need be
        raw = cache.get(oid)
        if raw is None:
            raw = decode(oid) if oid in by_id else store.get(oid)
        return raw

    def base_of(oid: str) -> str | None:
        if oid in by_id:
            return by_id[oid].entry.base
        row = store.row(oid)
        return row.base if row is not None else None

    def context_below(oid: str):  # a ULP_STEP link's context when the walk stopped at its base
        def context():
            base = base_of(oid)
            return None if base is None else raw_of(base)
        return context

    def decode(oid: str) -> bytes:
        chain = resolve_chain(oid, lookup, stop=stop, where="the fetched packs")
        below = chain[-1].base
        if below is None:
            raw, d = None, -1
        elif below in by_id:
            raw, d = cache.get(below), depth[below]
        else:
            row = store.row(below)
            raw, d = store.get(below), row.depth
        above = {link.id: len(chain) - k for k, link in enumerate(chain)}  # links above ``below``

        def decoded(link: _Link, raw: bytes) -> None:
            depth[link.id] = d + above[link.id]
            if link.id in is_base:
                cache.put(link.id, raw)

        return decode_links(chain, payload, below=raw, context=None if below is None else context_below(below),
                            where=lambda link: f"remote pack {link.pack[:12]}", on_decoded=decoded)[0]

    try:
        out = []
        for name, entries in per_pack:
            rows = []
            for e in entries:
                if e.id not in depth:
                    decode(e.id)
                rows.append(ObjectRow(e.id, name, e.offset, e.length, e.raw_size, e.method, e.base, depth[e.id]))
            out.append(rows)
        return out
    finally:
        for fh in files.values():
            fh.close()


# -- range fetches (lazy clones) -----------------------------------------------------------------
def _spans(entries, gap: int = COALESCE_GAP):
    """Group pack entries sorted by offset into ranges worth one request each."""
    span = []
    for e in entries:
        if span and (e.offset - (span[-1].offset + span[-1].length) > gap
                     or e.offset + e.length - span[0].offset > MAX_REQUEST):
            yield span
            span = []
        span.append(e)
    if span:
        yield span


def _wanted(object_ids, lookup, index: dict[str, tuple[str, PackEntry]], have) -> dict[str, tuple[str, PackEntry]]:
    """``object_ids`` and the delta bases their chains need down to what ``have(id)`` says
    is already in hand: (pack, entry) by id."""
    wanted: dict[str, tuple[str, PackEntry]] = {}
    for oid in dict.fromkeys(object_ids):
        if oid in wanted or have(oid):
            continue
        for entry in resolve_chain(oid, lookup, stop=lambda o: o in wanted or have(o), where="the remote"):
            wanted[entry.id] = index[entry.id]
    return wanted


def _pack(name: str) -> Handle:
    return Handle("pack", name)


def read_payloads(remote: Backend, wanted: dict[str, tuple[str, PackEntry]], gap: int = COALESCE_GAP,
                  file_of=_pack):
    """(entry, payload) of each wanted object, read with one range request per span of
    neighbouring entries in a pack (one commit's objects lie side by side in its pack).
    ``file_of``: a pack's name -> the remote file's handle (a step record's data area: its own)."""
    by_pack: dict[str, list[PackEntry]] = {}
    for name, entry in wanted.values():
        by_pack.setdefault(name, []).append(entry)
    for name, entries in sorted(by_pack.items()):
        for span in _spans(sorted(entries, key=lambda e: e.offset), gap):
            start = span[0].offset
            data = remote.read_range(file_of(name), start, span[-1].offset + span[-1].length - start)
            for e in span:
                yield e, data[e.offset - start : e.offset - start + e.length]


def fetch_objects(store: ObjectStore, remote: Backend, index: dict[str, tuple[str, PackEntry]],
                  object_ids, work_dir: Path, progress: Progress = NULL) -> int:
    """Make ``object_ids`` and the delta bases they need local, by range reads into the
    remote's packs: written into one new pack, verified like any fetch, recorded in one
    transaction. Returns the bytes downloaded."""
    before = remote.bytes_downloaded

    def lookup(oid: str):
        found = index.get(oid)
        if found is None:
            raise RemoteError(f"object {ids.short(oid)} is neither local nor on the remote")
        return found[1]

    wanted = _wanted(object_ids, lookup, index, store.has)
    if not wanted:
        return 0
    sweep_work_dirs(work_dir)  # a killed lazy fetch's pack
    tmp = make_work_dir(work_dir, "lazy")
    try:
        writer = PackWriter(tmp)
        progress.start(sum(e.length for _, e in wanted.values()), "fetching objects")
        copy_payloads(writer, read_payloads(remote, wanted), progress)
        progress.close()
        name, size = writer.finish()
        staged = tmp / pack_filename(name)
        (rows,) = verify_packs(store, [(name, staged)])  # every object decoded and hash-checked
        os.replace(staged, store.packs_dir / pack_filename(name))
        fsync_dir(store.packs_dir)
        with store.db.write():
            store.insert_rows((name, size), rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return remote.bytes_downloaded - before


# -- remote views ----------------------------------------------------------------------------------
class RemoteChunks:
    """Chunk bytes of a remote by range reads into its packs, each verified, with a cache.

    ``base_chunks`` (optional): chunks of the remote's base model, which are in no pack.
    """

    def __init__(self, remote: Backend, index: dict[str, tuple[str, PackEntry]], base_chunks=None,
                 cache_bytes: int = VIEW_CACHE_BYTES, *, held=None, keep_keyframe=None):
        self.remote = remote
        self.index = index
        self.base_chunks = base_chunks
        self.cache = decoded_cache(cache_bytes)
        # chunk bytes the caller already holds (a follower's current tensors: anything with
        # ``in`` and ``[]``): a delta chain stops there instead of fetching its base
        self.held = held
        self.payloads: dict[str, bytes] = {}  # fetched by prefetch, not yet decoded
        self.keep_keyframe = keep_keyframe  # called with (id, bytes) of each keyframe decoded (a follower keeps them)

    def _have(self, oid: str) -> bool:
        return oid in self.cache or oid in self.payloads or self._from_base(oid) or self._holds(oid)

    def prefetch(self, object_ids) -> None:
        """Download the payloads that ``object_ids`` need (their chains down to what is
        held, cached or in the base) in as few range requests as the packs allow: one
        commit's new objects lie side by side in one pack, so a follower's update is one
        request or a few instead of one per chunk. Decoding and verification still happen
        on use (``__call__``)."""
        for e, payload in read_payloads(self.remote, _wanted(object_ids, self._lookup, self.index, self._have)):
            self.payloads[e.id] = payload

    def _holds(self, oid: str) -> bool:
        return self.held is not None and oid in self.held

    def _from_base(self, oid: str) -> bool:
        return oid not in self.index and self.base_chunks is not None and oid in self.base_chunks

    def _lookup(self, oid: str):
        found = self.index.get(oid)
        if found is None:
            raise MissingObject(f"remote has no object {ids.short(oid)}")
        return found[1]

    def _base_bytes(self, oid: str) -> bytes | None:
        """The bytes of ``oid``'s delta base (a ULP_STEP payload on top of ``oid`` needs
        them): held by a follower (the version it had before), cached, or fetched."""
        found = self.index.get(oid)
        base = found[1].base if found is not None else None
        return None if base is None else self(base)

    def __call__(self, oid: str) -> bytes:
        raw = self.cache.get(oid)
        if raw is not None:
            return raw
        if self._holds(oid):
            return self.held[oid]
        if self._from_base(oid):
            raw = self.base_chunks(oid)
            self.cache.put(oid, raw)
            return raw
        chain = resolve_chain(oid, self._lookup,
                              stop=lambda o: o in self.cache or self._from_base(o) or self._holds(o),
                              where="the remote")
        below = chain[-1].base

        def payload_of(entry: PackEntry) -> bytes:
            payload = self.payloads.pop(entry.id, None)
            return payload if payload is not None else \
                self.remote.read_range(_pack(self.index[entry.id][0]), entry.offset, entry.length)

        def decoded(entry: PackEntry, raw: bytes) -> None:
            self.cache.put(entry.id, raw)
            if entry.base is None and self.keep_keyframe is not None:
                self.keep_keyframe(entry.id, raw)

        return decode_links(chain, payload_of, below=None if below is None else self(below),
                            context=None if below is None else (lambda: self._base_bytes(below)),
                            where=lambda entry: f"remote pack {self.index[entry.id][0][:12]}", on_decoded=decoded)[0]
