"""The chunk store: chunks in, verified chunks out.

Writes go through a chunk writer (store/chunk_writer.py, built by :meth:`ObjectStore.writer`).
Reads decode the delta chain from its keyframe down and check every decoded chunk's
blake3 against its id, so a damaged pack can never yield wrong bytes silently. Database
lookups stay on the calling thread; workers only read packs and decode.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Protocol

from .. import ids
from ..errors import CorruptObject, MissingObject, PackMissing
from ..lru import LRUCache
from ..progress import NULL, Progress
from ..codec import pool as codec_pool
from . import anchors
from .chains import MAX_CHAIN_LINKS, decode_links, resolve_chain
from .chunk_writer import DEFAULT_MAX_CHAIN, ChunkWriter
from .database import Database
from .external import BASE_PACK, EXTERNAL_METHOD, ExternalFiles
from .packs import PackReader, PackWriter, copy_payloads, pack_filename
from .rows import ObjectRow

ROW_BATCH = 500  # ids per query (SQLite before 3.32 binds at most 999 parameters)
STEP_PAYLOAD_BYTES = 256 << 20  # step payloads coded at commit time (below), for the pushes after
RECENT_DECODED_BYTES = 64 << 20  # chunks the step records of a repository's pushes keep decoded for the next push's
FIRST_ROWS = 16  # ids of get_many's first query: enough to start the pool, quick to answer


# codec.Method's PLANES and ULP_EXP, and the step coders (ULP_STEP, STEP_BLOCKS, STEP_RUNS: a payload decoded
# in the context of its base's base), which the objects table records (the store reads them
# without importing the codec; tests/test_delta_on_keyframe.py checks they agree)
_PLANES, _ULP_EXP, _STEP_CODERS = 1, 5, (7, 8, 9)


def _batches(object_ids):
    """The distinct ids, ROW_BATCH at a time (one IN (...) query each)."""
    wanted = list(dict.fromkeys(object_ids))
    for k in range(0, len(wanted), ROW_BATCH):
        yield wanted[k : k + ROW_BATCH]


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
        # the inner links of the last commit's chunks' chains, up to as many bytes again: the
        # anchors that later versions are encoded against (store/anchors.py)
        self.anchor_chunks: dict[str, bytes] = {}
        self.anchor_bytes = 0
        # The chunks recent pushes' step records (and prunes' layouts) decoded (ids name the
        # bytes, so nothing goes stale): a push's chunk is the next step's base, then its
        # context, and an anchor is the base of the steps after it. Without them a push that a
        # plain commit came before (no Publisher keeping raw chunks) decoded the parent's and
        # grandparent's whole chains again: two thirds of a push's time in benchmarks/long_run.py.
        self.recent_decoded: LRUCache[str, bytes] = LRUCache(RECENT_DECODED_BYTES, weight=len)
        # A long-lived writer's step payloads, coded at commit time where its stored payload
        # is not one step's change (an anchor step's, a keyframe's: store/anchors.py), for
        # the next push's step records (remotes/step_record_writer.py). The commit holds the chunk,
        # its parent's and its grandparent's bytes (the chunks kept); the push did not and
        # decoded their chains, serially: the anchor syncs' growth in issue 65 (a push of
        # 0.03 s took 1.0-1.2 s at an anchor step, 74M). Named by (chunk, parent chunk,
        # context chunk, dtype): never stale.
        self.step_payloads: LRUCache[tuple, object] = LRUCache(STEP_PAYLOAD_BYTES, weight=lambda e: len(e.payload))
        self.step_parents: dict[str, str] = {}  # the last commit's chunks: the chunk each replaced at its place
        self._kept_by: ObjectStore = self  # whose kept chunks kept_chunk reads (read_kept_of)

    def keep_recent(self, nbytes: int) -> None:
        """Keep each commit's raw chunks, up to ``nbytes``, for the next one (see above)."""
        self.keep_recent_bytes = nbytes

    def read_kept_of(self, writer: "ObjectStore") -> None:
        """Read what ``writer``, this repository's store on another connection in this
        process, keeps: its kept raw chunks, the step payloads it coded at commit time and
        the chunks decoded lately (the Publisher commits on one connection and pushes on
        another, side by side). All are named by their content, so nothing read from there
        is ever stale, and the caches are thread-safe; the kept dicts are only replaced or
        changed an entry at a time by the writer, and read here an entry at a time. Without
        it the Publisher's push built each anchor step's record itself, decoding the chains
        the commit had in hand (1.1 s against 0.02 s a push at 74M, ~8 s at 494M)."""
        self._kept_by = writer
        self.step_payloads = writer.step_payloads
        self.recent_decoded = writer.recent_decoded

    def kept_chunk(self, object_id: str) -> bytes | None:
        """A chunk's bytes if a long-lived writer kept them (see above), else None."""
        kept_by = self._kept_by
        for kept in (kept_by.recent_chunks, kept_by.older_chunks, kept_by.anchor_chunks):
            raw = kept.get(object_id)
            if raw is not None:
                return raw
        return None

    def keep_anchors(self, moves, positions: dict[str, int]) -> None:
        """Follow the chains a commit extended: ``moves``, (the parent chunk's chain ids, top
        first; how many links above the new chunk's base), one per new delta. The links
        above its base leave the new chunk's chain; a parent that is the base becomes an
        inner link, kept while the budget allows if it is an anchor (``positions``: its
        anchor position, store/anchors.py, a multiple of ANCHOR_SPACING; unknown: a root).
        Only an anchor is ever a later version's base other than its parent, or a base's
        base (a step context): the step versions between anchors, kept too before, were
        three of every four copies held here and never read (the chunks of the last commit,
        the bases of most versions, are ``recent_chunks``; the commit before's, their step
        contexts, ``older_chunks``)."""
        for chain_ids, above in moves:
            for oid in chain_ids[:above]:
                raw = self.anchor_chunks.pop(oid, None)
                if raw is not None:
                    self.anchor_bytes -= len(raw)
            parent = chain_ids[0]
            if above == 0 and parent not in self.anchor_chunks and positions.get(parent, 0) % anchors.ANCHOR_SPACING == 0:
                raw = self.recent_chunks.get(parent)
                if raw is not None and self.anchor_bytes + len(raw) <= self.keep_recent_bytes:
                    self.anchor_chunks[parent] = raw
                    self.anchor_bytes += len(raw)

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

    def anchor_positions(self, object_ids) -> dict[str, int]:
        """The anchor positions (store/anchors.py) of those of ``object_ids`` that have one."""
        found: dict[str, int] = {}
        for batch in _batches(object_ids):
            found.update(self.db.conn.execute(
                f"SELECT id, position FROM anchor_positions WHERE id IN ({','.join('?' * len(batch))})", batch))
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
                and (chain[-3].method not in _STEP_CODERS if len(chain) >= 3 else not with_base) \
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
        chain = self.chain(object_id)
        try:
            return self.decode_chain(chain)
        except PackMissing:
            again = self.chain(object_id)  # a gc or prune in another process moved its rows meanwhile?
            if again == chain:
                raise
            return self.decode_chain(again)

    def get_from(self, object_id: str, known: dict[str, bytes]) -> bytes:
        """:meth:`get`, starting from the highest link of the chain whose bytes (and, for a
        ULP_STEP link above it, its base's) are in ``known``; adds every link it decodes to
        ``known``. For a caller that reads neighbouring versions of a chunk (a push's step
        records: a chunk, its parent's and the grandparent's, which share most of a chain)."""
        if object_id in known:
            return known[object_id]
        chain = self.chain(object_id)
        for k in range(1, len(chain)):
            link = chain[k]
            if link.id in known and (link.base is None or link.base in known
                                     or chain[k - 1].method not in _STEP_CODERS):
                links, below = chain[:k], known[link.id]
                context = known.get(link.base) if link.base is not None else None
                break
        else:
            links, below, context = chain, None, None

        def payload_of(row: ObjectRow):
            return self.reader.view(row.pack, row.offset, row.length)

        if any(r.external for r in links):
            raw = self.get(object_id)
        else:
            raw, _ = decode_links(links, payload_of, below=below, context=context,
                                  where=lambda r: f"pack {r.pack[:12]}", verify=lambda k: k == 0,
                                  on_decoded=lambda row, data: known.__setitem__(row.id, data))
        known[object_id] = raw
        return raw

    def get_many(self, object_ids):
        """Yield each chunk's bytes in order, decoding ahead on the pool (see codec_pool.IN_FLIGHT_BYTES).

        The rows are looked up FIRST_ROWS ids first, then ROW_BATCH at a time, as the chunks
        are handed out: the pool starts on the first chunks while the rest are looked up
        (all of a many-tensor checkout's rows first kept the pool idle ~10 ms)."""
        object_ids = list(object_ids)
        queue, ahead = collections.deque(), 0
        small = codec_pool.SmallTasks(self.decode_chain, lambda size, share: queue.append((share, size)))
        at = 0
        while at < len(object_ids):
            batch = object_ids[at : at + (FIRST_ROWS if at == 0 else ROW_BATCH)]
            at += len(batch)
            known = self.chain_rows(batch)
            for oid in batch:
                chain = self.chain(oid, known=known)
                size = chain[0].raw_size
                if size < codec_pool.SMALL_CHUNK:
                    small.add(size, (chain,))
                else:
                    small.flush()  # (results are yielded in order)
                    queue.append((codec_pool.pool().submit(self.decode_chain, chain), size))
                ahead += size
                while queue and (ahead >= codec_pool.IN_FLIGHT_BYTES or len(queue) >= codec_pool.MAX_IN_FLIGHT):
                    future, size = queue.popleft()
                    ahead -= size
                    yield future.result()
        small.flush()
        while queue:
            yield queue.popleft()[0].result()

    def writer(self, *, device: str = "cpu", max_chain: int = DEFAULT_MAX_CHAIN, level: int = 1) -> "ChunkWriter":
        return ChunkWriter(self, device=device, max_chain=max_chain, level=level)

    def insert_rows(self, pack: tuple[str, int] | None, rows: list[ObjectRow]) -> None:
        """Record a finished pack and its objects, and the anchor positions a writer gave
        them (store/anchors.py); call inside the caller's transaction."""
        if pack is None:
            return
        self.db.conn.executemany("INSERT OR IGNORE INTO anchor_positions VALUES (?, ?)",
                                 [(r.id, r.position) for r in rows if r.position])
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

    def reencoded(self, rows: list[ObjectRow], rebased) -> None:
        """Point ``rows``' objects at their new payloads (pack, offset, length, method, base,
        depth: a prune re-encoding what kept versions need); inside the caller's transaction,
        after :meth:`insert_rows` or :meth:`relocate` recorded the pack. ``rebased``: those
        whose base changed (see :meth:`rebased_ids`)."""
        self.db.conn.executemany(
            "UPDATE objects SET pack = ?, offset = ?, length = ?, method = ?, base = ?, depth = ? WHERE id = ?",
            [(r.pack, r.offset, r.length, r.method, r.base, r.depth, r.id) for r in rows])
        self.db.conn.executemany("INSERT OR IGNORE INTO reencoded_objects VALUES (?)", [(o,) for o in rebased])
        # a re-encoded chunk's chain is no longer the line its position counted: a root now
        self.db.conn.executemany("DELETE FROM anchor_positions WHERE id = ?", [(r.id,) for r in rows])

    def pack_file_intact(self, name: str, size: int) -> bool:
        """Whether ``name``'s pack file is in place with the size its writer made: checked
        before a row is pointed into a pack written earlier (prune), in case it was removed."""
        try:
            return (self.packs_dir / pack_filename(name)).stat().st_size == size
        except FileNotFoundError:
            return False

    def check_new_pack(self, pack: tuple[str, int], rows: list[ObjectRow]) -> None:
        """After :meth:`insert_rows` of ``rows`` (``pack``'s), inside the same transaction: the
        pack file is still there (gc, which unlinks packs no row names under the same lock,
        may have taken it for a leftover before this record), each new delta's base is still stored, at the depth its writer read, and each new ULP_STEP
        payload's base still has the base that was its step context. A prune or gc that ran
        between the writer's encoding and this record may have removed a base or re-encoded it
        on another (a payload decoded against another context is wrong bytes): StaleWrite,
        and the caller's transaction rolls back (docs/design.md, "prune")."""
        from ..errors import StaleWrite

        if not self.pack_file_intact(*pack):
            raise StaleWrite(f"the new pack {pack[0][:12]} was removed before this version was recorded (a concurrent "
                             "gc with no grace period?); nothing was recorded: retry")
        pack = pack[0]
        mine = [r for r in rows if r.base is not None]
        if not mine:
            return
        current = self.rows({r.id for r in mine} | {r.base for r in mine})
        external = self.present({r.base for r in mine if r.base not in current})
        for r in mine:
            if current.get(r.id) is None or current[r.id].pack != pack:
                continue  # another writer recorded the same chunk first: its row stands, not this one
            base = current.get(r.base)
            if base is None and r.base not in external:
                raise StaleWrite(f"the delta base {ids.short(r.base)} of new chunk {ids.short(r.id)} was removed "
                                     "while this version was being written (a concurrent prune or gc); nothing was "
                                     "recorded: retry")
            if base is not None and (base.depth + 1 != r.depth or (r.context is not None and base.base != r.context)):
                raise StaleWrite(f"the delta base {ids.short(r.base)} of new chunk {ids.short(r.id)} was re-encoded "
                                     "while this version was being written (a concurrent prune); nothing was "
                                     "recorded: retry")

    def rebased_ids(self) -> set[str]:
        """Chunks a prune re-encoded on a new base: never a ULP_STEP payload's base (their
        base's base, the step context, may differ in another store holding them)."""
        return {r[0] for r in self.db.query("SELECT id FROM reencoded_objects")}

    def set_depths(self, depths: dict[str, int]) -> None:
        """Correct the recorded chain depth of objects whose chain got shorter; inside the caller's transaction."""
        self.db.conn.executemany("UPDATE objects SET depth = ? WHERE id = ?", [(d, o) for o, d in depths.items()])

    def forget(self, object_ids, packs) -> None:
        """Delete rows of objects and packs (gc); inside the caller's transaction."""
        object_ids = list(object_ids)
        self.db.conn.executemany("DELETE FROM objects WHERE id = ?", [(o,) for o in object_ids])
        self.db.conn.executemany("DELETE FROM reencoded_objects WHERE id = ?", [(o,) for o in object_ids])
        self.db.conn.executemany("DELETE FROM anchor_positions WHERE id = ?", [(o,) for o in object_ids])
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
