"""The object store: chunks in, verified chunks out.

Writes go through a :class:`ChunkWriter`, which dedups by id, encodes new chunks (against
a base chunk when one is given and its delta chain is short enough) and appends them to a
pack. It inserts no rows: the caller commits its rows together with the tree, commit and
ref move, in one transaction, after the pack is durable (see docs/design.md).

Reads decode the delta chain from its keyframe down and check every decoded chunk's
blake3 against its id, so a damaged pack can never yield wrong bytes silently.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .. import codec, ids
from ..errors import CorruptObject, MissingObject
from .database import Database
from .packs import PackReader, PackWriter

DEFAULT_MAX_CHAIN = 8


@dataclass(frozen=True)
class ObjectRow:
    id: str
    pack: str
    offset: int
    length: int
    raw_size: int
    method: int
    base: str | None
    depth: int


class ObjectStore:
    def __init__(self, db: Database, packs_dir: Path):
        self.db = db
        self.packs_dir = packs_dir
        self.reader = PackReader(packs_dir)

    def row(self, object_id: str) -> ObjectRow | None:
        r = self.db.conn.execute(
            "SELECT id, pack, offset, length, raw_size, method, base, depth FROM objects WHERE id = ?",
            (object_id,),
        ).fetchone()
        return ObjectRow(*r) if r else None

    def has(self, object_id: str) -> bool:
        return self.db.one("SELECT 1 FROM objects WHERE id = ?", (object_id,)) is not None

    def get(self, object_id: str) -> bytes:
        """The raw bytes of a chunk, decoded through its delta chain and hash-verified."""
        chain = []
        cursor = object_id
        while cursor is not None:
            row = self.row(cursor)
            if row is None:
                raise MissingObject(f"object {ids.short(cursor)} is missing from the store")
            chain.append(row)
            if len(chain) > 10_000:
                raise CorruptObject(f"object {ids.short(object_id)} has a cyclic delta chain")
            cursor = row.base
        raw = None
        for row in reversed(chain):
            payload = self.reader.read(row.pack, row.offset, row.length)
            try:
                raw = codec.decode(payload, row.raw_size, raw)
            except CorruptObject as exc:
                raise CorruptObject(f"object {ids.short(row.id)} in pack {row.pack[:12]}: {exc}") from None
            if ids.chunk_id(raw) != row.id:
                raise CorruptObject(f"object {ids.short(row.id)} in pack {row.pack[:12]} fails its hash check")
        return raw

    def writer(self, *, device: str = "cpu", max_chain: int = DEFAULT_MAX_CHAIN, level: int = 1) -> "ChunkWriter":
        return ChunkWriter(self, device=device, max_chain=max_chain, level=level)

    def insert_rows(self, pack: tuple[str, int] | None, rows: list[ObjectRow]) -> None:
        """Record a finished pack and its objects; call inside the caller's transaction."""
        if pack is None:
            return
        name, size = pack
        self.db.conn.execute(
            "INSERT OR IGNORE INTO packs VALUES (?, ?, ?, ?)", (name, size, len(rows), int(time.time()))
        )
        self.db.conn.executemany(
            "INSERT OR IGNORE INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(r.id, name, r.offset, r.length, r.raw_size, r.method, r.base, r.depth) for r in rows],
        )


class ChunkWriter:
    """Collects new chunks of one operation into one pack."""

    def __init__(self, store: ObjectStore, *, device: str, max_chain: int, level: int):
        self.store = store
        self.device = device
        self.max_chain = max_chain
        self.level = level
        self.pack = PackWriter(store.packs_dir)
        self.pending: dict[str, ObjectRow] = {}
        self.stored_bytes = 0
        self.finished: tuple[str, int] | None = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None or self.finished is None:
            self.pack.abort()

    def known(self, object_id: str) -> bool:
        return object_id in self.pending or self.store.has(object_id)

    def put(self, raw, dtype, base_id: str | None = None, object_id: str | None = None) -> tuple[str, int]:
        """Store ``raw`` (unless present); returns (id, stored bytes this call added)."""
        object_id = object_id or ids.chunk_id(raw)
        if self.known(object_id):
            return object_id, 0
        base_raw, base_row = None, None
        if base_id is not None and base_id != object_id:
            base_row = self.store.row(base_id)
            if base_row is not None and base_row.depth < self.max_chain and base_row.raw_size == len(raw):
                base_raw = self.store.get(base_id)
            else:
                base_row = None
        encoded = codec.encode(raw, dtype, base_raw, device=self.device, level=self.level)
        base = base_row.id if encoded.uses_base else None
        depth = base_row.depth + 1 if encoded.uses_base else 0
        entry = self.pack.add(object_id, encoded.payload, len(raw), int(encoded.method), base)
        self.pending[object_id] = ObjectRow(
            object_id, "", entry.offset, entry.length, len(raw), int(encoded.method), base, depth
        )
        self.stored_bytes += len(encoded.payload)
        return object_id, len(encoded.payload)

    def finish(self) -> tuple[tuple[str, int] | None, list[ObjectRow]]:
        """Make the pack durable; returns what :meth:`ObjectStore.insert_rows` records."""
        self.finished = self.pack.finish() or ("", 0)
        rows = list(self.pending.values())
        return (self.finished if self.finished[0] else None), rows
