"""The chunk writer: collects the new chunks of one operation (a commit, a merge, a DCP
rank's save) into one pack, deduplicating by id and encoding new chunks against their delta
base on the codec pool (codec/pool.py), on the host or, for a batch of device tensors, on
the device. It inserts no rows: the caller records them with the tree and commit in one
transaction once the pack is durable (Repository.record).

Which stored version a new chunk is encoded against is the anchor policy's
(store/anchors.py: a hierarchy of anchors on the parent chunk's chain, bounded by
``max_chain``; docs/codec.md, "Anchor policy").
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from .. import ids
from . import anchors
from ..codec import pool as codec_pool
from .packs import PackWriter
from .rows import ObjectRow

DEFAULT_MAX_CHAIN = 8  # with the payload rule of store/anchors.py; measured in benchmarks/sync.py (docs/measurements.md)
# A commit sends the chunks it is offered to the pool in groups of at most this many, or
# this many bytes: one query for the group finds those the store holds (ChunkWriter.put).
OFFERED_CHUNKS = 32
OFFERED_BYTES = 4 << 20


@dataclass
class _Offered:
    """A new chunk of a device batch, between its offer and its encoding."""

    object_id: str
    raw: object  # the host copy
    x: object  # the bytes on the device
    dtype: object
    chain: list[ObjectRow] | None  # its delta base's chain
    slot: int | None  # where its base lies in the batch's upload (when it has one)
    prepared: object = None  # the Future of ChunkWriter._prepare


def _context_id(encoded, base_chain) -> str | None:
    """The id of a step payload's context (the step coders: the base's base as this
    writer read it)."""
    if not encoded.method.uses_context:
        return None
    return base_chain[1].id


class _Deferred:
    """An in-flight entry of a device batch: the Future of its Encoded is known only once
    the batch is launched; ``result()`` gives what :meth:`ChunkWriter._encode` returns."""

    def __init__(self, base: ObjectRow | None, raw_size: int):
        self.base, self.raw_size, self.future = base, raw_size, None

    def result(self):
        encoded = self.future.result()
        return encoded, self.raw_size, self.base if encoded.uses_base else None, None  # (never a step coder's)

    def cancel(self) -> bool:
        return self.future.cancel() if self.future is not None else False


class ChunkWriter:
    """Collects new chunks of one operation into one pack, encoding them in parallel."""

    def __init__(self, store, *, device: str, max_chain: int, level: int):
        """``store``: the ObjectStore (store/chunks.py) that builds this writer (``writer()``)."""
        self.store = store
        self.device = device
        self.max_chain = max_chain
        self.level = level
        self.pack = PackWriter(store.packs_dir)
        self.pending: dict[str, ObjectRow] = {}
        self.in_flight: collections.deque = collections.deque()
        self.in_flight_ids: set[str] = set()
        self.in_flight_bytes = 0
        self.stored_bytes = 0
        self.finished: tuple[str, int] | None = None
        self.kept: dict[str, bytes] = {}  # this commit's raw chunks, for store.recent_chunks
        self.kept_bytes = 0
        self.base_rows: dict[str, ObjectRow] = {}  # see expect_bases
        self.base_positions: dict[str, int] = {}  # their anchor positions (store/anchors.py)
        self.positions: dict[str, int] = {}  # each new chunk's, once its base is chosen
        self.chain_moves: dict[str, tuple[list[str], int]] = {}  # id: (parent's chain ids, base index): finish
        self.offered: list[tuple] = []  # (id, raw, dtype, base id) not yet sent (put)
        self.offered_ids: set[str] = set()
        self.offered_bytes = 0
        self.rebased = store.rebased_ids()  # never a base with a step context (see _base_and_context)
        # A long-lived writer's (store.keep_recent_bytes) step payloads: see store.step_payloads
        self.step_parents: dict[str, str] = {}  # id: the chunk it replaced at its place
        self.step_coded: dict[tuple, object] = {}  # (id, parent, context, dtype): Encoded, filled on the pool

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None or self.finished is None:
            for _, future, _ in self.in_flight:
                future.cancel()
            self.pack.abort()

    def expect_bases(self, base_ids) -> None:
        """Look up the chains of chunks about to be offered as delta bases (a parent file's)
        in a few queries now, instead of a query per link at each :meth:`put`."""
        found = self.store.chain_rows(b for b in base_ids if b not in self.base_rows)
        self.base_rows.update(found)
        self.base_positions.update(self.store.anchor_positions(list(found)))

    def known(self, object_id: str) -> bool:
        return self._holds(object_id) or self.store.has(object_id)

    def _holds(self, object_id: str) -> bool:
        """Whether this writer has the chunk already: written, being encoded, or offered."""
        return object_id in self.pending or object_id in self.in_flight_ids or object_id in self.offered_ids

    def _base_chain(self, base_id: str | None, object_id: str, size: int) -> list[ObjectRow] | None:
        """The chain to decode for the delta base, chosen on the parent chunk's (``base_id``)
        chain by the anchor policy (store/anchors.py): mostly the parent itself, so the
        payload is one step's change; every ANCHOR_SPACING-th version an anchor further down; the
        keyframe when the chain is full. Records the new chunk's anchor position."""
        self.positions[object_id] = 0
        if base_id is None or base_id == object_id:
            return None
        row = self.base_rows.get(base_id) or self.store._row_or_supplied(base_id)  # (a lazy clone's parent may not be fetched yet)
        if row is None or row.raw_size == 0:
            return None
        chain = self.store.chain(base_id, row, self.base_rows)
        ids_ = [r.id for r in chain]
        if any(i not in self.base_rows for i in ids_):
            self.base_positions.update(self.store.anchor_positions(ids_))
        base, self.positions[object_id] = anchors.choose_base(chain, self.base_positions, self.max_chain)
        self.chain_moves[object_id] = (ids_, len(chain) - len(base))
        return base

    def put(self, raw, dtype, base_id: str | None = None) -> str:
        """Offer a chunk; returns its id. New chunks are encoded in the background."""
        object_id = ids.chunk_id(raw)
        if self.store.keep_recent_bytes and base_id is not None:
            self.step_parents[object_id] = base_id
        if self.kept_bytes + len(raw) <= self.store.keep_recent_bytes and object_id not in self.kept:
            self.kept[object_id] = bytes(raw)
            self.kept_bytes += len(raw)
        if self._holds(object_id):
            return object_id
        self.offered.append((object_id, raw, dtype, base_id))
        self.offered_ids.add(object_id)
        self.offered_bytes += len(raw)
        if len(self.offered) >= OFFERED_CHUNKS or self.offered_bytes >= OFFERED_BYTES:
            self._submit_offered()
        return object_id

    def _submit_offered(self) -> None:
        """Send the chunks offered since the last call to the pool, less those the store
        holds already, found in one query: a query per chunk, on the thread that reads and
        hashes the chunks, cost ~90 us of its time each (the GIL handed to a worker and
        waited for back), a third of a small tensor's whole cost."""
        if not self.offered:
            return
        stored = self.store.present([o[0] for o in self.offered])
        small = codec_pool.SmallTasks(self._encode, lambda key, share: self.in_flight.append((key[0], share, key[1])))
        for object_id, raw, dtype, base_id in self.offered:
            if object_id in stored:
                continue
            base_chain = self._base_chain(base_id, object_id, len(raw))
            base_raw = self.store.kept_chunk(base_chain[0].id) if base_chain else None
            args = (raw, dtype, base_chain, base_raw, self._step_sources(object_id, base_id))
            if len(raw) < codec_pool.SMALL_CHUNK:
                small.add((object_id, len(raw)), args)
            else:
                small.flush()  # (results are taken in order)
                self.in_flight.append((object_id, codec_pool.pool().submit(self._encode, *args), len(raw)))
            self.in_flight_ids.add(object_id)
            self.in_flight_bytes += len(raw)
        small.flush()
        self.offered.clear()
        self.offered_ids.clear()
        self.offered_bytes = 0
        while self.in_flight and (self.in_flight_bytes >= codec_pool.IN_FLIGHT_BYTES or len(self.in_flight) >= codec_pool.MAX_IN_FLIGHT):
            self._drain_one()

    def put_device_batch(self, items, copies) -> list[str]:
        """Offer a batch of chunks that live on a torch device (a commit from device memory);
        returns their ids. ``items``: (host copy of the bytes, the bytes on the device as a
        uint8 tensor, dtype, base id or None); ``copies``: the operation's
        :class:`~wvc.codec.device_copy.DeviceCopies`.

        The same payloads as :meth:`put`, computed where each part is cheapest: the ids
        hashed from the host copies on the pool; each new chunk's base decoded (or taken
        from the chunks kept) and its method chosen on the pool; the bases that the device
        encodes against copied up in one copy; the transforms of every chunk the device
        takes in a few passes (codec/batched.py). ULP_STEP candidates and small chunks
        (where every method is tried in full) are encoded on the host, as by :meth:`put`.
        """
        from ..codec import batched

        self._submit_offered()  # (chunks offered by put before this batch go first)
        object_ids = list(codec_pool.pool().map(lambda item: ids.chunk_id(item[0]), items))
        offered: list[_Offered] = []
        upload_bytes = 0
        for (raw, x, dtype, base_id), object_id in zip(items, object_ids):
            if self.kept_bytes + len(raw) <= self.store.keep_recent_bytes and object_id not in self.kept:
                self.kept[object_id] = bytes(raw)
                self.kept_bytes += len(raw)
            if self.known(object_id):
                continue
            self.in_flight_ids.add(object_id)
            chain = self._base_chain(base_id, object_id, len(raw))
            offered.append(_Offered(object_id, raw, x, dtype, chain, upload_bytes if chain else None))
            upload_bytes += len(raw) if chain else 0
        # The bases go up in one copy, from one pinned buffer that the preparing workers fill
        # side by side (a serial copy into it on this thread took as long as the upload).
        staging = copies.staging(upload_bytes) if upload_bytes else None
        slots = staging.numpy() if staging is not None else None
        for o in offered:
            base_raw = self.store.kept_chunk(o.chain[0].id) if o.chain else None
            target = slots[o.slot : o.slot + len(o.raw)] if o.slot is not None else None
            o.prepared = codec_pool.pool().submit(self._prepare, o.raw, o.dtype, o.chain, base_raw, target)
        on_device, deferred = [], []
        for o in offered:
            base_raw, context, method = o.prepared.result()
            if method is None:  # the host's: a ULP_STEP candidate, or a small chunk
                future = codec_pool.pool().submit(self._encode_prepared, o.raw, o.dtype, o.chain, base_raw, context)
            else:
                future = _Deferred(o.chain[0] if method.uses_base else None, len(o.raw))
                deferred.append(future)
                on_device.append((o, method))
            self.in_flight.append((o.object_id, future, len(o.raw)))
            self.in_flight_bytes += len(o.raw)
        if on_device:
            # the bases a device transform needs, uploaded in one copy: each chunk its slot
            uploaded = copies.upload(staging) if any(m.uses_base for _, m in on_device) else None
            chunks = [batched.DeviceChunk(o.x, uploaded[o.slot : o.slot + len(o.raw)] if m.uses_base else None,
                                          o.dtype, m) for o, m in on_device]
            encoded = batched.encode_on_device(chunks, level=self.level, submit=codec_pool.pool().submit,
                                               copy=copies.to_host)
            for entry, future in zip(deferred, encoded):
                entry.future = future
        # two batches in flight at most: the host compresses this one while the caller
        # copies and transforms the next
        while self.in_flight and self.in_flight_bytes > copies.batch_bytes:
            self._drain_one()
        return object_ids

    def _prepare(self, raw, dtype, base_chain, base_raw, target):
        """(base bytes, ULP_STEP context, the method the device encodes, or None: the host's);
        a base the device will need is written into ``target``, its slot of the upload."""
        from ..codec import transforms

        base_raw, context = self._base_and_context(raw, base_chain, base_raw)
        if context is not None and transforms.tries_step(raw, dtype, base_raw, context):
            return base_raw, context, None
        method = transforms.chosen_method(raw, dtype, base_raw, self.level) if len(raw) else None
        if method is not None and method.uses_base:
            target[:] = memoryview(transforms.fit_base(base_raw, len(raw))).cast("B")
        return base_raw, None, method

    def _encode_prepared(self, raw, dtype, base_chain, base_raw, context):
        from .. import codec

        encoded = codec.encode(raw, dtype, base_raw, context=context, device="cpu", level=self.level)
        return encoded, len(raw), base_chain[0] if encoded.uses_base else None, _context_id(encoded, base_chain)

    def _base_and_context(self, raw, base_chain, base_raw):
        """The base's bytes (decoded unless given) and ULP_STEP's context: the link below
        the base (the base's own base, when the chain was not re-anchored), only of the
        same byte size as the chunk and its base (a shape change is not a step). The dtype
        is the chunk's own: the snapshot offers a parent chunk as base only when the dtype
        is unchanged, so a chain never crosses dtypes. A base that a prune re-encoded on a
        new base gives no context: another store may hold it on its old one."""
        context = None
        if base_raw is None and base_chain:
            base_raw, context = self.store.decode_chain_and_base(base_chain)
        elif base_chain and len(base_chain) > 1:
            context = self.store.kept_chunk(base_chain[1].id)
            if context is None:  # (not kept: a budget too small for the chains' anchors)
                context = self.store.decode_chain(base_chain[1:])
        if context is not None and (not len(context) == len(base_raw) == len(raw) or base_chain[0].id in self.rebased):
            context = None
        return base_raw, context

    def _encode(self, raw, dtype, base_chain, base_raw=None, step=None):
        """The chunk encoded against its base chain's head; the link below the head (the
        base's own base, when the chain was not re-anchored) is ULP_STEP's context. With
        ``step`` (:meth:`_step_sources`), also its step payload where the stored one is not
        the step's."""
        from .. import codec

        base_raw, context = self._base_and_context(raw, base_chain, base_raw)
        encoded = codec.encode(raw, dtype, base_raw, context=context, device=self.device, level=self.level)
        base = base_chain[0] if encoded.uses_base else None
        if step is not None:
            self._code_step(raw, dtype, encoded, base_chain, step)
        return encoded, len(raw), base, _context_id(encoded, base_chain)

    def _step_sources(self, object_id: str, parent_id: str | None):
        """What a push's step record codes a new chunk against (remotes/step_record_writer.py): its
        parent chunk's bytes, and as context the chunk the grandparent held at its place
        (None where it held the parent's), when this writer keeps recent chunks and has both
        in hand; else None (the push codes it, if it needs to)."""
        if not self.store.keep_recent_bytes or parent_id is None or parent_id == object_id:
            return None
        parent_raw = self.store.kept_chunk(parent_id)
        grand = self.store.step_parents.get(parent_id)  # (the last commit's put of the parent chunk)
        if parent_raw is None or grand is None:
            return None
        if grand == parent_id:
            return object_id, parent_id, parent_raw, None, None
        context_raw = self.store.kept_chunk(grand)
        return None if context_raw is None else (object_id, parent_id, parent_raw, grand, context_raw)

    def _code_step(self, raw, dtype, encoded, base_chain, step) -> None:
        """The chunk's step payload (against its parent chunk, in its grandparent's context),
        unless the stored payload is that step already: for the next push's step record,
        coded here, on the pool, with every chunk it needs in hand."""
        from .. import codec

        object_id, parent_id, parent_raw, context_id, context_raw = step
        stored_context = base_chain[1].id if base_chain and len(base_chain) > 1 else None
        if (encoded.uses_base and base_chain[0].id == parent_id
                and (stored_context == context_id or (context_id is None and not encoded.method.uses_context))):
            return  # a follower of the parent decodes the stored payload: the record sends it
        coded = codec.encode(raw, dtype, parent_raw, context=context_raw, level=self.level)
        self.step_coded[(object_id, parent_id, context_id, dtype)] = coded

    def _drain_one(self) -> None:
        object_id, future, size = self.in_flight.popleft()
        self.in_flight_bytes -= size
        encoded, raw_size, base, context = future.result()
        entry = self.pack.add(object_id, encoded.payload, raw_size, int(encoded.method), base.id if base else None)
        self.pending[object_id] = ObjectRow(
            object_id, "", entry.offset, entry.length, raw_size, int(encoded.method),
            base.id if base else None, base.depth + 1 if base else 0,
            position=self.positions.get(object_id, 0) if base else 0,  # (a keyframe is a root)
            context=context,
        )
        self.in_flight_ids.discard(object_id)
        self.stored_bytes += len(encoded.payload)
        if base is None and object_id in self.chain_moves:  # a keyframe after all: on no chain of the parent's
            ids_ = self.chain_moves[object_id][0]
            self.chain_moves[object_id] = (ids_, len(ids_))

    def finish(self) -> tuple[tuple[str, int] | None, list[ObjectRow]]:
        """Make the pack durable; returns what :meth:`ObjectStore.insert_rows` records."""
        self._submit_offered()
        while self.in_flight:
            self._drain_one()
        self.finished = self.pack.finish() or ("", 0)
        rows = list(self.pending.values())
        if self.store.keep_recent_bytes:
            # the next commit's delta bases, and their bases: ULP_STEP's contexts
            self.store.keep_anchors(self.chain_moves.values(), self.base_positions)
            self.store.older_chunks, self.store.recent_chunks = self.store.recent_chunks, self.kept
            self.store.step_parents = self.step_parents
            for key, coded in self.step_coded.items():
                self.store.step_payloads.put(key, coded)
        self.kept = {}
        return (self.finished if self.finished[0] else None), rows
