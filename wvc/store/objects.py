"""The object store: chunks in, verified chunks out.

Writes go through a :class:`ChunkWriter`, which dedups by id, encodes new chunks (against
a base chunk when one is given) on a small thread pool and appends them to a pack in the
order they were offered. It inserts no rows: the caller commits its rows together with
the tree, commit and ref move, in one transaction, after the pack is durable (see
docs/design.md).

Delta chains are bounded: when the base's chain is already ``max_chain`` deep, the chunk
is encoded against the chain's keyframe instead (re-anchoring), so no read ever decodes
more than ``max_chain + 1`` payloads and long runs do not pay for full keyframes.

Reads decode the delta chain from its keyframe down and check every decoded chunk's
blake3 against its id, so a damaged pack can never yield wrong bytes silently. Database
lookups stay on the calling thread; workers only read packs and decode.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import settings
from .. import allocator, ids
from ..errors import CorruptObject, MissingObject
from ..progress import NULL, Progress
from .chains import MAX_CHAIN_LINKS, decode_links, resolve_chain
from .database import Database
from .external import BASE_PACK, EXTERNAL_METHOD, ExternalFiles
from .packs import PackReader, PackWriter, copy_payloads

ROW_BATCH = 500  # ids per query (SQLite before 3.32 binds at most 999 parameters)
FIRST_ROWS = 16  # ids of get_many's first query: enough to start the pool, quick to answer
DEFAULT_MAX_CHAIN = 8  # with the payload rule of ChunkWriter._base_chain; measured in benchmarks/sync.py (docs/design.md, "Anchor policy")


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (``taskset``, a container's cpuset, a
    launcher's pinning of ranks), not the machine's count, which a 2-CPU pod on a 64-core
    host would read as 64."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # (not Linux)
        return os.cpu_count() or 1


def _codec_threads() -> int:
    """The codec pool's size: the usable CPUs, at most 4 (each thread holds ~5 chunk-sized
    buffers, and 2 x threads x 4 MiB may be in flight); ``WVC_CODEC_THREADS`` sets it (1 to
    64), so a machine with more cores can be measured with more (benchmarks/speed.py's 1-
    and 2-core runs show the scaling on two)."""
    value = settings.text("WVC_CODEC_THREADS")
    if value and value.isdigit() and 1 <= int(value) <= 64:
        return int(value)
    return max(1, min(4, usable_cpus()))


WORKERS = _codec_threads()
# How far ahead of the caller the pool works: at most IN_FLIGHT_BYTES of raw chunks (which
# bounds memory) and at most MAX_IN_FLIGHT chunks. A bound in bytes rather than in chunks:
# results are taken in order, and with a count bound one big chunk at the head stalled the
# pool behind it once a few small ones (biases, norms) had filled the window.
IN_FLIGHT_BYTES = 2 * WORKERS * (4 << 20)
MAX_IN_FLIGHT = 64
# A commit sends the chunks it is offered to the pool in groups of at most this many, or
# this many bytes: one query for the group finds those the store holds (ChunkWriter.put).
OFFERED_CHUNKS = 32
OFFERED_BYTES = 4 << 20
# Chunks under SMALL_CHUNK bytes (biases, norms) are coded SMALL_PER_TASK to a pool task:
# one each cost a hand-off to a worker and back, whose wake-ups and context switches took
# more CPU than coding the chunk (a commit of 3,000 768-byte tensors: a fifth of its time).
SMALL_CHUNK = 64 * 1024
SMALL_PER_TASK = 32


class _Share:
    """One chunk's result in a pool task that codes several small chunks in turn."""

    __slots__ = ("future", "index")

    def __init__(self, future, index: int):
        self.future, self.index = future, index

    def result(self):
        return self.future.result()[self.index]

    def cancel(self) -> bool:
        return self.future.cancel()


def _each(fn, items) -> list:
    return [fn(*args) for args in items]


class _SmallTasks:
    """Collects consecutive small chunks' work into tasks of up to SMALL_PER_TASK; ``flush``
    submits what is collected and hands each chunk its :class:`_Share`, in order."""

    def __init__(self, fn, on_share):
        self.fn, self.on_share, self.items, self.keys = fn, on_share, [], []

    def add(self, key, args) -> None:
        self.items.append(args)
        self.keys.append(key)
        if len(self.items) >= SMALL_PER_TASK:
            self.flush()

    def flush(self) -> None:
        if not self.items:
            return
        future = pool().submit(_each, self.fn, self.items)
        for k, key in enumerate(self.keys):
            self.on_share(key, _Share(future, k))
        self.items, self.keys = [], []


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
    file: str | None = None  # set for an external object: its path in the base directory

    @property
    def external(self) -> bool:
        return self.file is not None


# codec.Method's PLANES, ULP_EXP and ULP_STEP, which the objects table records (the store reads them
# without importing the codec; tests/test_delta_on_keyframe.py checks they agree)
_PLANES, _ULP_EXP, _ULP_STEP = 1, 5, 7


def _batches(object_ids):
    """The distinct ids, ROW_BATCH at a time (one IN (...) query each)."""
    wanted = list(dict.fromkeys(object_ids))
    for k in range(0, len(wanted), ROW_BATCH):
        yield wanted[k : k + ROW_BATCH]


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def pool() -> ThreadPoolExecutor:
    """One process-wide pool: zstd, blake3 and numpy release the GIL, so threads scale."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            allocator.keep_chunk_buffers()  # chunk-sized buffers: no page faults per chunk
            _POOL = ThreadPoolExecutor(WORKERS, thread_name_prefix="wvc-codec")
        return _POOL


class ChunkSupply(Protocol):
    """Where a store turns for chunks that none of its packs hold (a lazy clone's remote).

    Handed to the store when it is built (wvc/repo.py); the store calls it from the thread
    that asked for the chunks, never from a decode worker.
    """

    downloaded_bytes: int

    def supply(self, store: "ObjectStore", object_ids: list[str], progress: Progress) -> None:
        """Make ``object_ids``, and the delta bases they need, local in ``store`` (or raise)."""


class ObjectStore:
    def __init__(self, db: Database, packs_dir: Path, external: ExternalFiles | None = None,
                 supply: ChunkSupply | None = None, max_links: int = MAX_CHAIN_LINKS):
        self.db = db
        # the longest chain this store reads: the hard bound, or more for a repository an
        # older wvc made with a deeper --max-chain (its own chains stay readable)
        self.max_links = max_links
        self.packs_dir = packs_dir
        self.reader = PackReader(packs_dir)
        self.external = external  # a base model's files, when the repository has one
        self.supply = supply  # a lazy clone's remote: chunks not fetched yet
        # A long-lived writer (the Publisher: a commit every training step) keeps the raw
        # chunks of its last commit, up to this many bytes, so that the next commit's delta
        # bases are in hand instead of decoded through their chains (deep chains follow the
        # steps: decoding them grew a commit's time with each step). The commit before's are
        # kept too, up to as many bytes: the bases' own bases, ULP_STEP's contexts. 0: keep nothing.
        self.keep_recent_bytes = 0
        self.recent_chunks: dict[str, bytes] = {}
        self.older_chunks: dict[str, bytes] = {}  # the commit before's (ChunkWriter.finish)

    def keep_recent(self, nbytes: int) -> None:
        """Keep each commit's raw chunks, up to ``nbytes``, for the next one (see above)."""
        self.keep_recent_bytes = nbytes

    def row(self, object_id: str) -> ObjectRow | None:
        r = self.db.conn.execute(
            "SELECT id, pack, offset, length, raw_size, method, base, depth FROM objects WHERE id = ?",
            (object_id,),
        ).fetchone()
        if r:
            return ObjectRow(*r)
        r = self.db.conn.execute("SELECT path, offset, length FROM external_objects WHERE id = ?", (object_id,)).fetchone()
        if r:  # a base chunk: a keyframe (depth 0) that lives in the base's file
            return ObjectRow(object_id, BASE_PACK, r[1], r[2], r[2], EXTERNAL_METHOD, None, 0, r[0])
        return None

    def rows(self, object_ids) -> dict[str, ObjectRow]:
        """The rows of those of ``object_ids`` that a pack holds: one query per ROW_BATCH ids
        (a lookup per chunk cost a checkout of 824 small tensors more time on its main
        thread than writing the file)."""
        found: dict[str, ObjectRow] = {}
        for batch in _batches(object_ids):
            for r in self.db.conn.execute(
                    "SELECT id, pack, offset, length, raw_size, method, base, depth FROM objects "
                    f"WHERE id IN ({','.join('?' * len(batch))})", batch):
                found[r[0]] = ObjectRow(*r)
        return found

    def chain_rows(self, object_ids) -> dict[str, ObjectRow]:
        """Rows of ``object_ids`` and of every base below them, a level of the chains at a
        time (:meth:`rows` per level), for :meth:`chain`'s ``known``. Objects that no pack
        holds (a base's files, a lazy clone's remote) are left to :meth:`chain`'s lookups."""
        found: dict[str, ObjectRow] = {}
        level = list(dict.fromkeys(object_ids))
        for _ in range(self.max_links):
            rows = self.rows(level)
            found.update(rows)
            level = [r.base for r in rows.values() if r.base is not None and r.base not in found]
            if not level:
                break
        return found

    def present(self, object_ids) -> set[str]:
        """Those of ``object_ids`` the store holds, in a pack or a base's files (batched)."""
        found: set[str] = set()
        for batch in _batches(object_ids):
            marks = ",".join("?" * len(batch))
            found.update(o for (o,) in self.db.conn.execute(
                f"SELECT id FROM objects WHERE id IN ({marks}) UNION SELECT id FROM external_objects WHERE id IN ({marks})",
                batch + batch))
        return found

    def has(self, object_id: str) -> bool:
        return self.db.one("SELECT 1 FROM objects WHERE id = ? UNION ALL "
                           "SELECT 1 FROM external_objects WHERE id = ? LIMIT 1", (object_id, object_id)) is not None

    def ensure_local(self, object_ids, progress: Progress = NULL) -> None:
        """Have the supply fetch whichever of ``object_ids`` the store lacks (a lazy clone)."""
        if self.supply is None:
            return
        missing = [o for o in dict.fromkeys(object_ids) if not self.has(o)]
        if missing:
            self.supply.supply(self, missing, progress)

    def _row_or_supplied(self, object_id: str) -> ObjectRow | None:
        row = self.row(object_id)
        if row is None and self.supply is not None:
            self.supply.supply(self, [object_id], NULL)
            row = self.row(object_id)
        return row

    def chain(self, object_id: str, row: ObjectRow | None = None,
              known: dict[str, ObjectRow] | None = None) -> list[ObjectRow]:
        """The rows to decode for ``object_id`` (whose ``row`` the caller may have, or rows
        from :meth:`chain_rows` in ``known``): itself first, its keyframe last (store/chains.py)."""
        def lookup(oid: str) -> ObjectRow | None:
            if row is not None and row.id == oid:
                return row
            found = known.get(oid) if known is not None else None
            return found if found is not None else self._row_or_supplied(oid)

        return resolve_chain(object_id, lookup, max_links=self.max_links)

    def decode_chain(self, chain: list[ObjectRow]) -> bytes:
        """Decode rows from :meth:`chain` (no database access: safe on a worker thread).

        Only the result is hash-checked: a wrong link anywhere below it would change the
        result, so its check covers the whole chain (a collision aside), and hashing every
        link cost a quarter of a checkout's CPU. When it fails, the chain is decoded again
        checking every link, so that the error names the first bad object.
        """
        return self._decode(chain, with_base=False)[0]

    def decode_chain_and_base(self, chain: list[ObjectRow]) -> tuple[bytes, bytes | None]:
        """:meth:`decode_chain`, and the bytes of the chain's second link (None for a keyframe)."""
        return self._decode(chain, with_base=True)

    def _decode(self, chain: list[ObjectRow], with_base: bool) -> tuple[bytes, bytes | None]:
        try:
            return self._decode_links(chain, verify_links=False, with_base=with_base)
        except CorruptObject:
            if len(chain) == 1:
                raise
            return self._decode_links(chain, verify_links=True, with_base=with_base)

    def _decode_links(self, chain: list[ObjectRow], verify_links: bool,
                      with_base: bool = True) -> tuple[bytes, bytes | None]:
        """(the chain's result, the link below it; None for the link below unless
        ``with_base``): a ULP_STEP link needs the two below it, its base and the base's
        base, which a chain down to its keyframe always holds.

        The keyframe and the delta over it are decoded in one pass (codec.decode_on_keyframe:
        no base materialised; a checkout's most common chain is a fine-tune over its starting
        version), unless their bytes are wanted: the keyframe's as the context of a ULP_STEP
        link above the pair, or as the link below a two-link chain's result ``with_base``.
        A pair of another shape is decoded link by link; links checked one by one never
        take the pass."""
        raw = None
        top = len(chain) - 1
        views: dict[str, memoryview] = {}  # payloads the one-pass attempt mapped already
        if not verify_links and len(chain) >= 2 and chain[-2].method == _ULP_EXP and chain[-1].method == _PLANES \
                and (chain[-3].method != _ULP_STEP if len(chain) >= 3 else not with_base) \
                and not (chain[-1].external or chain[-2].external):
            from .. import codec

            for k in (-2, -1):
                views[chain[k].id] = self.reader.view(chain[k].pack, chain[k].offset, chain[k].length)
            raw = codec.decode_on_keyframe(views[chain[-2].id], views[chain[-1].id], chain[-2].raw_size)  # (a CorruptObject: checked link by link)
            if raw is not None:
                top = len(chain) - 3
                if top < 0 and ids.chunk_id(raw) != chain[0].id:  # (the pair is the chain: its result is checked here)
                    raise CorruptObject(f"object {ids.short(chain[0].id)} fails its hash check")
        links = chain[: top + 1]
        if links and links[-1].external:  # a base model's chunk: a keyframe read from its file
            row = links.pop()
            if self.external is None:
                raise MissingObject(f"object {ids.short(row.id)} belongs to a base this repository cannot read")
            raw = self.external.read(row.id, row.file, row.offset, row.length, verify=verify_links or not links)
        if not links:
            return raw, None

        def payload_of(row: ObjectRow):
            view = views.get(row.id)
            return view if view is not None else self.reader.view(row.pack, row.offset, row.length)

        return decode_links(links, payload_of, below=raw, where=lambda r: f"pack {r.pack[:12]}",
                            verify=lambda k: verify_links or k == 0)

    def get(self, object_id: str) -> bytes:
        """The raw bytes of a chunk, decoded through its delta chain and hash-verified."""
        return self.decode_chain(self.chain(object_id))

    def get_many(self, object_ids):
        """Yield each chunk's bytes in order, decoding ahead on the pool (see IN_FLIGHT_BYTES).

        The rows are looked up FIRST_ROWS ids first, then ROW_BATCH at a time, as the chunks
        are handed out: the pool starts on the first chunks while the rest are looked up
        (all of a many-tensor checkout's rows first kept the pool idle ~10 ms)."""
        object_ids = list(object_ids)
        queue, ahead = collections.deque(), 0
        small = _SmallTasks(self.decode_chain, lambda size, share: queue.append((share, size)))
        at = 0
        while at < len(object_ids):
            batch = object_ids[at : at + (FIRST_ROWS if at == 0 else ROW_BATCH)]
            at += len(batch)
            known = self.chain_rows(batch)
            for oid in batch:
                chain = self.chain(oid, known=known)
                size = chain[0].raw_size
                if size < SMALL_CHUNK:
                    small.add(size, (chain,))
                else:
                    small.flush()  # (results are yielded in order)
                    queue.append((pool().submit(self.decode_chain, chain), size))
                ahead += size
                while queue and (ahead >= IN_FLIGHT_BYTES or len(queue) >= MAX_IN_FLIGHT):
                    future, size = queue.popleft()
                    ahead -= size
                    yield future.result()
        small.flush()
        while queue:
            yield queue.popleft()[0].result()

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


    # -- what gc, fsck and stats ask of the store -----------------------------------------------
    def has_pack(self, name: str) -> bool:
        return self.db.one("SELECT 1 FROM packs WHERE name = ?", (name,)) is not None

    def pack_names(self) -> list[str]:
        return [n for (n,) in self.db.query("SELECT name FROM packs")]

    def pack_ages(self) -> dict[str, int]:
        """Pack name -> the time its rows were recorded."""
        return dict(self.db.query("SELECT name, created_at FROM packs"))

    def object_packs(self) -> list[tuple[str, str]]:
        """(object id, pack) of every object in a pack."""
        return self.db.query("SELECT id, pack FROM objects")

    def object_ids(self) -> list[str]:
        return [o for (o,) in self.db.query("SELECT id FROM objects")]

    def rows_in_packs(self, packs) -> list[ObjectRow]:
        packs = tuple(packs)
        return [ObjectRow(*r) for r in self.db.query(
            "SELECT id, pack, offset, length, raw_size, method, base, depth FROM objects "
            f"WHERE pack IN ({','.join('?' * len(packs))}) ORDER BY pack, offset", packs)] if packs else []

    def copy_to_new_pack(self, rows) -> tuple[tuple[str, int] | None, list[tuple[str, int]]]:
        """``rows``' payloads copied verbatim into one new pack (gc keeping the live objects of
        the packs it rewrites): the pack (None when ``rows`` is empty) and (id, new offset)
        of each, for :meth:`relocate`."""
        writer = PackWriter(self.packs_dir)
        try:
            entries = copy_payloads(writer, ((r, self.reader.read(r.pack, r.offset, r.length)) for r in rows))
            return writer.finish(), [(e.id, e.offset) for e in entries]
        except BaseException:
            writer.abort()
            raise

    def relocate(self, pack: tuple[str, int], moved: list[tuple[str, int]], created_at: int) -> None:
        """Point the rows of ``moved`` (id, offset) at ``pack``; inside the caller's transaction."""
        name, size = pack
        self.db.conn.execute("INSERT OR IGNORE INTO packs VALUES (?, ?, ?, ?)", (name, size, len(moved), created_at))
        self.db.conn.executemany("UPDATE objects SET pack = ?, offset = ? WHERE id = ?",
                                 [(name, off, oid) for oid, off in moved])

    def forget(self, object_ids, packs) -> None:
        """Delete rows of objects and packs (gc); inside the caller's transaction."""
        self.db.conn.executemany("DELETE FROM objects WHERE id = ?", [(o,) for o in object_ids])
        self.db.conn.executemany("DELETE FROM packs WHERE name = ?", [(p,) for p in packs])

    def count_objects(self) -> int:
        return self.db.one("SELECT COUNT(*) FROM objects")

    def count_packs(self) -> int:
        return self.db.one("SELECT COUNT(*) FROM packs")

    def bytes_by_method(self) -> dict[int, tuple[int, int]]:
        """method -> (objects, stored bytes)."""
        return {m: (n, b) for m, n, b in self.db.query(
            "SELECT method, COUNT(*), SUM(length) FROM objects GROUP BY method")}

    def add_external(self, locations: dict[str, tuple[str, int, int]]) -> None:
        """Record where a base model's chunks lie in its files; inside the caller's transaction."""
        self.db.conn.executemany("INSERT OR IGNORE INTO external_objects VALUES (?, ?, ?, ?)",
                                 [(cid, p, off, n) for cid, (p, off, n) in locations.items()])

    def external_rows(self) -> list[tuple[str, str, int, int]]:
        """(id, path, offset, length) of every base chunk, in file order."""
        return self.db.query("SELECT id, path, offset, length FROM external_objects ORDER BY path, offset")

    def count_external(self) -> int:
        return self.db.one("SELECT COUNT(*) FROM external_objects")


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


class _Deferred:
    """An in-flight entry of a device batch: the Future of its Encoded is known only once
    the batch is launched; ``result()`` gives what :meth:`ChunkWriter._encode` returns."""

    def __init__(self, base: ObjectRow | None, raw_size: int):
        self.base, self.raw_size, self.future = base, raw_size, None

    def result(self):
        encoded = self.future.result()
        return encoded, self.raw_size, self.base if encoded.uses_base else None

    def cancel(self) -> bool:
        return self.future.cancel() if self.future is not None else False


class ChunkWriter:
    """Collects new chunks of one operation into one pack, encoding them in parallel."""

    def __init__(self, store: ObjectStore, *, device: str, max_chain: int, level: int):
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
        self.offered: list[tuple] = []  # (id, raw, dtype, base id) not yet sent (put)
        self.offered_ids: set[str] = set()
        self.offered_bytes = 0

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
        self.base_rows.update(self.store.chain_rows(b for b in base_ids if b not in self.base_rows))

    def known(self, object_id: str) -> bool:
        return self._holds(object_id) or self.store.has(object_id)

    def _holds(self, object_id: str) -> bool:
        """Whether this writer has the chunk already: written, being encoded, or offered."""
        return object_id in self.pending or object_id in self.in_flight_ids or object_id in self.offered_ids

    def _base_chain(self, base_id: str | None, object_id: str, size: int) -> list[ObjectRow] | None:
        """The chain to decode for the delta base: the parent chunk's own, so the payload is
        one step's change (what a follower holding the parent downloads), re-anchored to the
        keyframe (depth 0) when the chain is full: ``max_chain`` links deep, or its deltas'
        payloads together larger than the keyframe's (decoding the chain would then cost
        more than decoding a second keyframe). See docs/design.md, "Anchor policy"."""
        if base_id is None or base_id == object_id:
            return None
        row = self.base_rows.get(base_id) or self.store._row_or_supplied(base_id)  # (a lazy clone's parent may not be fetched yet)
        if row is None or row.raw_size == 0:
            return None
        chain = self.store.chain(base_id, row, self.base_rows)
        if row.depth >= self.max_chain or sum(r.length for r in chain[:-1]) > chain[-1].length:
            chain = chain[-1:]  # the keyframe: depth 0
        return chain

    def put(self, raw, dtype, base_id: str | None = None) -> str:
        """Offer a chunk; returns its id. New chunks are encoded in the background."""
        object_id = ids.chunk_id(raw)
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
        small = _SmallTasks(self._encode, lambda key, share: self.in_flight.append((key[0], share, key[1])))
        for object_id, raw, dtype, base_id in self.offered:
            if object_id in stored:
                continue
            base_chain = self._base_chain(base_id, object_id, len(raw))
            base_raw = self.store.recent_chunks.get(base_chain[0].id) if base_chain else None
            args = (raw, dtype, base_chain, base_raw)
            if len(raw) < SMALL_CHUNK:
                small.add((object_id, len(raw)), args)
            else:
                small.flush()  # (results are taken in order)
                self.in_flight.append((object_id, pool().submit(self._encode, *args), len(raw)))
            self.in_flight_ids.add(object_id)
            self.in_flight_bytes += len(raw)
        small.flush()
        self.offered.clear()
        self.offered_ids.clear()
        self.offered_bytes = 0
        while self.in_flight and (self.in_flight_bytes >= IN_FLIGHT_BYTES or len(self.in_flight) >= MAX_IN_FLIGHT):
            self._drain_one()

    def put_device_batch(self, items, copies) -> list[str]:
        """Offer a batch of chunks that live on a torch device (a commit from device memory);
        returns their ids. ``items``: (host copy of the bytes, the bytes on the device as a
        uint8 tensor, dtype, base id or None); ``copies``: the operation's
        :class:`~wvc.device_copy.DeviceCopies`.

        The same payloads as :meth:`put`, computed where each part is cheapest: the ids
        hashed from the host copies on the pool; each new chunk's base decoded (or taken
        from the chunks kept) and its method chosen on the pool; the bases that the device
        encodes against copied up in one copy; the transforms of every chunk the device
        takes in a few passes (codec/batched.py). ULP_STEP candidates and small chunks
        (where every method is tried in full) are encoded on the host, as by :meth:`put`.
        """
        from ..codec import batched

        self._submit_offered()  # (chunks offered by put before this batch go first)
        object_ids = list(pool().map(lambda item: ids.chunk_id(item[0]), items))
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
            base_raw = self.store.recent_chunks.get(o.chain[0].id) if o.chain else None
            target = slots[o.slot : o.slot + len(o.raw)] if o.slot is not None else None
            o.prepared = pool().submit(self._prepare, o.raw, o.dtype, o.chain, base_raw, target)
        on_device, deferred = [], []
        for o in offered:
            base_raw, context, method = o.prepared.result()
            if method is None:  # the host's: a ULP_STEP candidate, or a small chunk
                future = pool().submit(self._encode_prepared, o.raw, o.dtype, o.chain, base_raw, context)
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
            encoded = batched.encode_on_device(chunks, level=self.level, submit=pool().submit,
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
        return encoded, len(raw), base_chain[0] if encoded.uses_base else None

    def _base_and_context(self, raw, base_chain, base_raw):
        """The base's bytes (decoded unless given) and ULP_STEP's context: the link below
        the base (the base's own base, when the chain was not re-anchored), only of the
        same byte size as the chunk and its base (a shape change is not a step). The dtype
        is the chunk's own: the snapshot offers a parent chunk as base only when the dtype
        is unchanged, so a chain never crosses dtypes."""
        context = None
        if base_raw is None and base_chain:
            base_raw, context = self.store.decode_chain_and_base(base_chain)
        elif base_chain and len(base_chain) > 1:
            context = self.store.older_chunks.get(base_chain[1].id)
        if context is not None and not len(context) == len(base_raw) == len(raw):
            context = None
        return base_raw, context

    def _encode(self, raw, dtype, base_chain, base_raw=None):
        """The chunk encoded against its base chain's head; the link below the head (the
        base's own base, when the chain was not re-anchored) is ULP_STEP's context."""
        from .. import codec

        base_raw, context = self._base_and_context(raw, base_chain, base_raw)
        encoded = codec.encode(raw, dtype, base_raw, context=context, device=self.device, level=self.level)
        base = base_chain[0] if encoded.uses_base else None
        return encoded, len(raw), base

    def _drain_one(self) -> None:
        object_id, future, size = self.in_flight.popleft()
        self.in_flight_bytes -= size
        encoded, raw_size, base = future.result()
        entry = self.pack.add(object_id, encoded.payload, raw_size, int(encoded.method), base.id if base else None)
        self.pending[object_id] = ObjectRow(
            object_id, "", entry.offset, entry.length, raw_size, int(encoded.method),
            base.id if base else None, base.depth + 1 if base else 0,
        )
        self.in_flight_ids.discard(object_id)
        self.stored_bytes += len(encoded.payload)

    def finish(self) -> tuple[tuple[str, int] | None, list[ObjectRow]]:
        """Make the pack durable; returns what :meth:`ObjectStore.insert_rows` records."""
        self._submit_offered()
        while self.in_flight:
            self._drain_one()
        self.finished = self.pack.finish() or ("", 0)
        rows = list(self.pending.values())
        if self.store.keep_recent_bytes:
            # the next commit's delta bases, and their bases: ULP_STEP's contexts
            self.store.older_chunks, self.store.recent_chunks = self.store.recent_chunks, self.kept
        self.kept = {}
        return (self.finished if self.finished[0] else None), rows
