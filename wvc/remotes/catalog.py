"""Catalogs: what a remote segment holds, in one file (remote format 2).

A push writes one segment: a pack (store/packs.py, unchanged) and its catalog,
``catalogs/<hash>.cat``: the pack's index entries and the canonical bytes of every commit
and tree the push carried. A reader lists the remote once and reads each catalog: the
whole history's graph and object index in a handful of requests, where format 1 needed one
request per commit, per tree and per pack index. Compaction (remotes/compaction.py)
merges segments, so the count of files stays bounded however many pushes there were.

File: zstd frame of ``b"WVCCAT\\x01\\n"``, u32 JSON length, canonical JSON
``{"pack": name or null, "entries": [...], "objects": [[kind, id, length], ...]}``,
then the objects' bytes back to back in that order. A kind is ``commit``, ``tree`` (its
canonical bytes) or ``tree-delta`` (the tree stored as a diff of another: model/tree_diff.py);
``trees`` holds both stored forms, told apart by the delta's magic. Named by the blake3 (PACK context) of
the whole file, like a pack. Untrusted when read: the decompressed size is bounded, every
field checked (entries as a pack index is, store/packs.parse_index), and every commit and
tree is verified against its id by the caller before use.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from .. import ids
from ..errors import CorruptObject
from ..model.versions import canonical_json
from ..formats import bounded_json
from ..store.packs import MAX_INDEX_BYTES, PackEntry, parse_index
from ..model.tree_diff import is_delta

MAGIC = b"WVCCAT\x01\n"
MAX_CATALOG_BYTES = 1 << 30  # decompressed; a catalog holds trees, which grow with the model
KINDS = ("commit", "tree", "tree-delta")  # a tree delta: a tree stored as a diff of another (model/tree_diff.py)


@dataclass
class Catalog:
    pack: str | None
    entries: list[PackEntry] = field(default_factory=list)
    commits: dict[str, bytes] = field(default_factory=dict)
    trees: dict[str, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        import zstandard

        objects = [["commit", i, len(d)] for i, d in sorted(self.commits.items())]
        objects += [["tree-delta" if is_delta(d) else "tree", i, len(d)] for i, d in sorted(self.trees.items())]
        meta = canonical_json({"pack": self.pack, "entries": [e.to_json() for e in self.entries], "objects": objects})
        body = b"".join([MAGIC, struct.pack("<I", len(meta)), meta,
                         *(self.commits[i] for i in sorted(self.commits)), *(self.trees[i] for i in sorted(self.trees))])
        return zstandard.ZstdCompressor(level=10).compress(body)

    @property
    def held_bytes(self) -> int:
        """About what the parsed catalog takes in memory (its commits and trees, ~300 bytes an
        entry with its lookups): what the parsed-catalog cache budgets. Not ``size``, which
        counts the pack's payloads: a segment holding a 30 MB keyframe took 30 MB of the
        budget, and a long run's catalogs were evicted and parsed again at every push."""
        return 300 * len(self.entries) + sum(map(len, self.commits.values())) + sum(map(len, self.trees.values()))

    def derived(self, build):
        """What ``build()`` makes of this parsed catalog (its Segment, with the lookups:
        remotes/repository.py), built once and kept with it."""
        cached = self.__dict__.get("_derived")
        if cached is None:
            cached = self.__dict__["_derived"] = build()
        return cached

    @property
    def size(self) -> int:
        """What rewriting the segment costs (compaction's tiers): payloads, commits and trees."""
        return segment_size(self.entries, self.commits, self.trees)


def segment_size(entries, commits: dict[str, bytes], trees: dict[str, bytes]) -> int:
    return sum(e.length for e in entries) + sum(map(len, commits.values())) + sum(map(len, trees.values()))


def catalog_name(data: bytes) -> str:
    return ids.digest(ids.PACK, data)


def parse_catalog(data: bytes, name: str) -> Catalog:
    """A remote catalog (untrusted) -> Catalog; its name must be the hash of its bytes."""
    import zstandard

    where = f"remote catalog {name[:12]}"
    if catalog_name(data) != name:
        raise CorruptObject(f"{where} does not match its name")
    try:
        declared = zstandard.frame_content_size(data)
        if declared < 0 or declared > MAX_CATALOG_BYTES:
            raise CorruptObject(f"{where} declares no size or more than {MAX_CATALOG_BYTES} bytes")
        body = zstandard.ZstdDecompressor().decompress(data, max_output_size=declared)
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"{where} is not a valid zstd frame ({exc})") from exc
    if not body.startswith(MAGIC) or len(body) < len(MAGIC) + 4:
        raise CorruptObject(f"{where} is not a wvc catalog")
    (meta_len,) = struct.unpack_from("<I", body, len(MAGIC))
    start = len(MAGIC) + 4
    if meta_len > MAX_INDEX_BYTES + (1 << 20):  # its entries are a pack index: refused before parsing it
        raise CorruptObject(f"{where} has a header of {meta_len} bytes, more than a pack index may hold")
    try:
        meta = bounded_json.loads(body[start : start + meta_len], f"{where}'s header")
        pack, raw_entries, objects = meta["pack"], meta["entries"], meta["objects"]
        if set(meta) != {"pack", "entries", "objects"} or not isinstance(objects, list):
            raise ValueError("unexpected fields")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        why = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise CorruptObject(f"{where} has a malformed header ({why})") from exc
    if pack is not None and not ids.is_object_id(pack):
        raise CorruptObject(f"{where} names an invalid pack")
    entries = parse_index(canonical_json(raw_entries), where)
    catalog = Catalog(pack, entries)
    cursor = start + meta_len
    for item in objects:
        if not (isinstance(item, list) and len(item) == 3 and item[0] in KINDS and ids.is_object_id(item[1])
                and type(item[2]) is int and 0 <= item[2] <= len(body) - cursor):
            raise CorruptObject(f"{where} lists an invalid object")
        kind, oid, length = item
        data = body[cursor : cursor + length]
        if kind != "commit" and is_delta(data) != (kind == "tree-delta"):
            raise CorruptObject(f"{where} lists a {kind} that is not one")
        (catalog.commits if kind == "commit" else catalog.trees)[oid] = data
        cursor += length
    if cursor != len(body):
        raise CorruptObject(f"{where} has trailing bytes")
    return catalog
