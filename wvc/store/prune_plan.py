"""A prune's plan over the chunk store: which chunks go, which stay, and which of those
staying are re-encoded (their chain ran through one that goes), on which base; then the pack
of re-encoded payloads, and the checks that the plan still holds under the write lock.

The verb (``ops/prune.py``) says which versions keep their weights and runs the steps in
their crash-safe order (docs/design.md, "prune"); this module only reads the store, except
:func:`write_pack`, which writes one new pack nothing records yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .. import ids
from ..codec.container import Method
from ..formats.dtypes import BYTES, DTYPES
from ..progress import NULL, Progress
from . import kept_bases
from .packs import PackWriter, copy_payloads
from .rows import ObjectRow


@dataclass
class PrunePlan:
    kept_chunks: set[str]
    rows: dict[str, ObjectRow]  # old rows of every chunk involved and its chain
    reencode: list[tuple[str, str | None]]  # (chunk, its new base or None), bases first
    freed: set[str]  # rows to delete
    dtypes: dict[str, str]
    rebased: set[str]  # re-encoded on a new base (the rest of ``reencode`` keeps its base)


class StalePlan(Exception):
    """Raised under the write lock when what landed since the plan makes it unsafe to apply."""


def preferred_bases(versions: list[dict]) -> tuple[dict[str, str], dict[str, int]]:
    """For each chunk of the run's kept versions (``versions``: their places, oldest first):
    the chunk the kept version before held at the same place, and the index of the
    first kept version holding it. Kept versions of a run are its every-Nth and last steps:
    the one before is the nearest version that stays, where the chunk's own chain may reach
    nothing that stays short of its keyframe (the anchor policy's anchors go with the steps
    between; several versions near a full chain share one link further down)."""
    preferred: dict[str, str] = {}
    order: dict[str, int] = {}
    before: dict = {}
    for k, places in enumerate(versions):
        for place, chunk in places.items():
            order.setdefault(chunk, k)
            older = before.get(place)
            if older is not None and older != chunk:
                preferred.setdefault(chunk, older)
        before = places
    return preferred, order


def _laid_out(store, versions: list[dict], dtypes, rows, kept: set[str], base_of, max_chain: int,
              preferred: dict[str, str]) -> set[str]:
    """Bases for the chunks of the run's kept versions from :mod:`.kept_bases` (a tree of
    kept versions by estimated cost, within ``max_chain``), written into ``preferred``; the
    chunks to re-encode onto theirs even where their chain stays (the versions it lays out
    afresh). Without a layout, ``preferred`` stays the kept version before. ``versions``: the
    places of the run's kept versions, oldest first (the newest MAX_VERSIONS are laid out)."""
    versions = versions[-kept_bases.MAX_VERSIONS:]
    if len(versions) < 2:
        return set()

    def staying(oid: str) -> str | None:  # the nearest link of the chain that stays
        link = base_of(oid)
        while link is not None and link not in kept:
            link = base_of(link)
        return link

    def needs(oid: str) -> bool:
        return base_of(oid) is not None and base_of(oid) not in kept

    def depth_now(oid: str) -> int:
        if not needs(oid):
            return rows[oid].depth if oid in rows else 0
        link = staying(oid)
        return 0 if link is None else (rows[link].depth if link in rows else 0) + 1

    root_depth = max((depth_now(c) for c in versions[0].values()), default=0)
    layout = kept_bases.kept_parents(store, versions, dtypes, rows, needs, max_chain, root_depth)
    if layout is None:
        return set()
    parents, stays = layout
    forced: set[str] = set()
    first: dict[str, int] = {}
    for k, places in enumerate(versions):
        for chunk in places.values():
            first.setdefault(chunk, k)
    for k, parent in enumerate(parents):
        if parent is None:
            continue
        for place, chunk in versions[k].items():
            older = versions[parent].get(place)
            if first[chunk] == k and older is not None and older != chunk:
                preferred[chunk] = older
                if k not in stays:
                    forced.add(chunk)
    return forced


def chunk_dtypes(trees) -> dict[str, str]:
    """Each chunk of ``trees`` -> the dtype its payload is coded as (bytes for headers and
    whole-file chunks): what a re-encoding passes to the codec. (A chain never crosses
    dtypes: a link no tree names has the dtype of the chunks above it.)"""
    dtypes: dict[str, str] = {}
    for tree in trees:
        for f in tree.files:
            if f.header:
                dtypes[f.header] = BYTES.name
            dtypes.update((c, BYTES.name) for c in f.chunks)
            for t in f.tensors:
                dtypes.update((c, t.dtype) for c in t.chunks)
    return dtypes


def plan(store, kept_trees: list, dropped_chunks: set[str], versions: list[dict], max_chain: int) -> PrunePlan:
    """Which chunks stay, which go, and which of those staying must be re-encoded (their
    chain runs through one that goes): each against the same place's chunk in the run's kept
    version before (:func:`preferred_bases`) when that keeps the chain within ``max_chain``,
    else against the nearest link of its chain that stays. Chains are followed through the
    plan's own re-encodings, bases first (the run's kept versions oldest first).
    ``kept_trees``: every tree whose chunks must stay readable; ``dropped_chunks``: those of
    the pruned versions; ``versions``: the places (``tree_diff.places``) of the run's kept
    versions, oldest first."""
    dtypes = chunk_dtypes(kept_trees)
    kept = set(dtypes)
    rows = store.chain_rows(kept | dropped_chunks)
    new_base: dict[str, str | None] = {}

    def base_of(oid: str) -> str | None:
        if oid in new_base:
            return new_base[oid]
        row = rows.get(oid)
        return row.base if row is not None else None

    preferred, order = preferred_bases(versions)
    forced = _laid_out(store, versions, dtypes, rows, kept, base_of, max_chain, preferred)

    def depth_over(oid: str, avoid: str) -> int | None:
        """The depth of ``oid``'s chain as the plan stands, or None if it passes ``avoid``."""
        depth, cursor = 0, base_of(oid)
        while cursor is not None:
            if cursor == avoid or depth > max_chain:
                return None
            depth, cursor = depth + 1, base_of(cursor)
        return depth

    def fits(base: str, oid: str) -> bool:
        """Whether ``oid`` on ``base`` stays within ``max_chain`` (as the plan stands)."""
        depth = depth_over(base, oid)
        return depth is not None and depth + 1 <= max_chain

    def with_room(start: str, avoid: str) -> str | None:
        """The first link of ``start``'s chain (as the plan stands) that a chunk can be
        encoded on within ``max_chain``: ``start`` itself unless it is already that deep."""
        cursor = start
        while cursor is not None and not fits(cursor, avoid):
            cursor = base_of(cursor)
        return cursor

    reencode = []
    for oid in sorted((o for o in kept if o in rows), key=lambda o: (order.get(o, math.inf), rows[o].depth)):
        link, needs = base_of(oid), False
        while link is not None and link not in kept:
            needs, link = True, base_of(link)
        near = preferred.get(oid)
        if not needs and (oid not in forced or near == link):
            if link is None or fits(link, oid):
                continue  # it stays as stored
            needs = True  # its base's chain was re-encoded deeper: past max_chain if it stayed
        if near is not None and near in kept and near in rows and near != link:
            room = with_room(near, oid)
            if room is not None:
                link = room
            elif not needs:
                continue
        elif not needs:
            continue
        if link is not None and not fits(link, oid):
            link = with_room(link, oid)
        new_base[oid] = link  # the base that stays (its own chain already fixed), or None
        reencode.append((oid, link))
    live = set()
    for oid in kept:
        cursor = oid
        while cursor is not None and cursor not in live:
            live.add(cursor)
            dtypes.setdefault(cursor, dtypes[oid])  # (a chain never crosses dtypes)
            cursor = base_of(cursor)
    # A step payload (a step coder's) is coded in the context of its base's base: where that base was
    # rebased, the payload is re-encoded on the same base, without a context.
    rebased = set(new_base)
    reencode += [(o, rows[o].base) for o in sorted(live, key=lambda o: rows[o].depth if o in rows else 0)
                 if o in rows and o not in rebased and rows[o].base in rebased and Method(rows[o].method).uses_context]
    freed = {o for o in rows if o not in live}
    return PrunePlan(kept, rows, reencode, freed, dtypes, rebased)


def _encoded(store, items: list[tuple[str, str | None]], rows: dict[str, ObjectRow], dtypes: dict[str, str],
             progress: Progress, what: str) -> list[tuple[str, str | None, int, object]]:
    """``items`` (chunk, base or None) re-encoded without a step context, from their chains
    as ``rows`` (or the store) has them now: (chunk, base, raw size, encoded)."""
    from .. import codec
    from ..codec import pool as codec_pool

    chains = {o: store.chain(o, known=rows) for o, _ in items}
    chains.update({b: store.chain(b, known=rows) for _, b in items if b is not None})

    def encode(item):
        oid, base = item
        raw = store.decode_chain(chains[oid])
        base_raw = store.decode_chain(chains[base]) if base is not None else None
        dtype = DTYPES.get(dtypes.get(oid, BYTES.name), BYTES)
        return oid, base, len(raw), codec.encode(raw, dtype, base_raw, device="cpu")

    progress.start(len(items), what, unit="chunks")
    encoded: list = []
    for k in range(0, len(items), 16):  # a bounded number of decoded chunks in flight
        encoded += list(codec_pool.pool().map(encode, items[k:k + 16]))
        progress.advance(min(16, len(items) - k))
    progress.close()
    return encoded


def write_pack(store, plan: PrunePlan, progress: Progress):
    """Step 2: re-encode, copy the live payloads of the packs that lose one; make it durable."""
    writer = PackWriter(store.packs_dir)
    try:
        encoded = _encoded(store, plan.reencode, plan.rows, plan.dtypes, progress, "re-encoding what kept versions need")
        new_rows = _added(writer, encoded, lambda oid: plan.rows[oid].depth if oid in plan.rows else 0)
        moving = {o for o, _ in plan.reencode}
        touched = {plan.rows[o].pack for o in plan.freed | moving}
        keep_rows = [r for r in store.rows_in_packs(touched) if r.id not in plan.freed and r.id not in moving]
        entries = copy_payloads(writer, ((r, store.reader.read(r.pack, r.offset, r.length)) for r in keep_rows))
        pack = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return _in_pack(new_rows, pack), [(e.id, e.offset) for e in entries], pack


def _added(writer: PackWriter, encoded, depth_below) -> list[ObjectRow]:
    """``encoded`` (:func:`_encoded`'s, bases first) added to ``writer``: their rows, each as
    deep as its base (``depth_below(base)`` for a base not among them) and one more."""
    depth: dict[str, int] = {}
    rows = []
    for oid, base, raw_size, enc in encoded:
        base = base if enc.uses_base else None
        entry = writer.add(oid, enc.payload, raw_size, int(enc.method), base)
        depth[oid] = 0 if base is None else (depth[base] if base in depth else depth_below(base)) + 1
        rows.append(ObjectRow(oid, "", entry.offset, entry.length, raw_size, int(enc.method), base, depth[oid]))
    return rows


def _in_pack(rows: list[ObjectRow], pack: tuple[str, int] | None) -> list[ObjectRow]:
    """``rows`` pointed at the finished ``pack``."""
    if pack is None:
        return rows
    return [ObjectRow(r.id, pack[0], r.offset, r.length, r.raw_size, r.method, r.base, r.depth) for r in rows]


def live_chunks(store, kept: set[str], new_rows: dict[str, ObjectRow],
                old_rows: dict[str, ObjectRow]) -> tuple[set[str], dict[str, ObjectRow]]:
    """Under the write lock: every chunk the kept versions need now (``kept``: their chunk
    ids), through the new rows;
    and the current rows of those (the plan's, and those recorded since)."""
    rows = dict(old_rows)
    rows.update(store.rows([o for o in kept if o not in rows]))
    live = set()
    frontier = list(kept)
    while frontier:
        oid = frontier.pop()
        if oid in live:
            continue
        live.add(oid)
        row = new_rows.get(oid) or rows.get(oid)
        if row is None:
            continue
        if row.base is not None and row.base not in rows and row.base not in new_rows:
            rows.update(store.rows([row.base]))
        if row.base is not None:
            frontier.append(row.base)
    return live, rows


def corrected_depths(live: set[str], new_rows: dict[str, ObjectRow], rows: dict[str, ObjectRow]) -> dict[str, int]:
    """The depth each live chunk's chain has after re-encoding (through ``new_rows``, else its
    current row), where it changed: those the plan re-encoded and those above them, recorded
    before the plan or since."""
    depth: dict[str, int] = {}

    def of(oid: str) -> int:
        path, cursor = [], oid
        while cursor is not None and cursor not in depth:
            row = new_rows.get(cursor) or rows.get(cursor)
            if row is None:  # a base's file, or not in a pack
                depth[cursor] = 0
                break
            path.append((cursor, row.base))
            cursor = row.base
        for oid_, base in reversed(path):
            depth[oid_] = 0 if base is None else depth[base] + 1
        return depth[oid]

    changed = {}
    for oid in live:
        row = new_rows.get(oid) or rows.get(oid)
        if row is not None and of(oid) != row.depth:
            changed[oid] = depth[oid]
    return changed


@dataclass
class CatchUp:
    """What a prune re-encodes for the commits recorded since its plan (before its write lock, and under it)."""
    items: list[tuple[str, str | None]]  # (chunk, its base or None), bases first
    rebased: set[str]  # those put on a new base (the rest keep theirs and lose their step context)


def catch_up(rebased: set[str], live: set[str], new_rows: dict[str, ObjectRow], rows: dict[str, ObjectRow],
             max_chain: int) -> CatchUp:
    """The live chunks the plan, applied as it stands, would break, and what to re-encode
    each on. They are chunks that commits from other processes recorded
    since the plan (or chunks it frees that such a commit needs again); training that commits
    every few seconds records one on the tip's chunks during every plan, so remaking the plan
    would never end. A step payload (it is decoded in the context of its base's base) whose
    base the plan puts on a new base keeps its base and loses its context, as the plan does
    for the chunks it saw; one whose chain would pass ``max_chain`` through a base re-encoded
    deeper goes on the first link of that chain with room, and steps on it lose their context
    in turn. ``rebased``: the chunks re-encoded so far on a new base (or as a keyframe);
    ``new_rows``: their rows and the other re-encoded ones; ``rows``: every live chunk's
    current row. Usually the chunks the first version committed since the plan changed: a few."""
    before, rebased = set(rebased), set(rebased)
    new_base: dict[str, str | None] = {}

    def base_of(oid: str) -> str | None:
        if oid in new_base:
            return new_base[oid]
        row = new_rows.get(oid) or rows.get(oid)
        return row.base if row is not None else None

    def depth_of(oid: str) -> int:
        depth, cursor = 0, base_of(oid)
        while cursor is not None:
            depth, cursor = depth + 1, base_of(cursor)
        return depth

    items: list[tuple[str, str | None]] = []
    for oid in sorted((o for o in live if o not in new_rows and o in rows and rows[o].base is not None),
                      key=lambda o: (rows[o].depth, o)):
        base = rows[oid].base
        if depth_of(base) + 1 > max_chain:
            link = base
            while link is not None and depth_of(link) + 1 > max_chain:
                link = base_of(link)
            new_base[oid] = link
            rebased.add(oid)
            items.append((oid, link))
        elif Method(rows[oid].method).uses_context and base in rebased:
            new_base[oid] = base
            items.append((oid, base))
    return CatchUp(items, rebased - before)


def live_dtypes(trees, rows: dict[str, ObjectRow]) -> dict[str, str]:
    """:func:`chunk_dtypes` of ``trees``, and the links of their chains (``rows``) no tree names."""
    dtypes = chunk_dtypes(trees)
    for oid in list(dtypes):
        row = rows.get(oid)
        while row is not None and row.base is not None and row.base not in dtypes:
            dtypes[row.base] = dtypes[oid]
            row = rows.get(row.base)
    return dtypes


def write_catch_up(store, fixes: CatchUp, new_rows: dict[str, ObjectRow], rows: dict[str, ObjectRow],
                   dtypes: dict[str, str]) -> tuple[list[ObjectRow], tuple[str, int] | None]:
    """:func:`catch_up`'s chunks re-encoded into a pack of their own, made durable (nothing
    records it yet); their rows (depths through ``new_rows``, the plan's). Their old payloads
    stay in their packs, unreferenced, until a prune frees something there and copies the
    pack's live payloads (they are the newest versions' chunks: the next prune usually does)."""
    writer = PackWriter(store.packs_dir)
    try:
        encoded = _encoded(store, fixes.items, rows, dtypes, NULL, "re-encoding chunks committed meanwhile")

        def depth_below(oid: str) -> int:  # through the plan's rows: an unmoved row's depth may be stale
            row = new_rows.get(oid) or rows.get(oid)
            return 0 if row is None or row.base is None else depth_below(row.base) + 1

        out = _added(writer, encoded, depth_below)
        pack = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return _in_pack(out, pack), pack


def check_still_valid(plan: PrunePlan, live: set[str], new_rows: dict[str, ObjectRow], rows: dict[str, ObjectRow],
                       depths: dict[str, int], max_chain: int) -> None:
    """Under the write lock, before anything is applied: the plan is still safe for what the
    kept versions need now, including chunks that commits from other processes recorded since
    it was made (their rows are not in ``plan.rows``). A live ULP_STEP payload the plan does
    not re-encode is decoded in the context of its base's base: if the plan gives its base a
    new base, that payload would decode to other bytes. And a chunk the plan never saw must
    not end up deeper than ``max_chain`` because its base was re-encoded deeper. Either way
    the plan is made again, seeing them (``StalePlan``)."""
    for oid in live:
        row = rows.get(oid)
        if oid in new_rows or row is None or row.base is None:
            continue
        moved = new_rows.get(row.base)
        if Method(row.method).uses_context and moved is not None and moved.base != rows[row.base].base:
            raise StalePlan(f"chunk {ids.short(oid)}, recorded since the plan, is a step on {ids.short(row.base)}, "
                             "which the plan re-encodes on another base")
        if oid not in plan.rows and depths.get(oid, row.depth) > max_chain:
            raise StalePlan(f"chunk {ids.short(oid)}, recorded since the plan, would pass max_chain")
