"""Remote compaction: the number of files on a remote stays bounded however many pushes.

Segments (a pack and its catalog, remotes/catalog.py) are sorted into tiers by their size
(payloads, commits and trees), each tier ``FANOUT`` times the one below (tier 0: under 64 KiB). When a push would
leave ``FANOUT`` segments in its tier, it merges them, with its own new objects, into one
segment of the next tier, and so on up (an LSM tree, as in restic's and git's repacking):
each byte is rewritten at most once per tier, and a remote of N pushes holds at most
``FANOUT - 1`` segments a tier, O(log N) files. Format-1 packs (a ``.idx`` each) take part
like any segment; format-1 commit and tree files are left as they are and still read.

Replaced files go in the same step as the push when the backend can (the Hub: one commit,
so a reader pinned to the previous commit keeps every file it listed). Elsewhere they are
listed in a ``retired/<time>-<hash>.json`` record published with the push, and deleted by
a later push once ``GRACE_SECONDS`` have passed, after checking that everything the refs
reach is still in a live segment (a push racing a ``gc --remote`` may have come to rely on
a retired one; then nothing is deleted yet).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import settings
from ..errors import CorruptObject, WvcError
from ..model import tree_diff
from ..model.versions import canonical_json
from ..store.packs import (MAGIC, XET_BOUNDARY, PackWriter, copy_payloads, marked_payload_end, pack_filename,
                           read_pack_index, read_payload)
from .catalog import Catalog
from .interface import Handle
from .layout import CATALOGS, PACKS, PRUNED, movable, new_record_name, record_time, retired_path

log = logging.getLogger(__name__)

FANOUT = 4
# Tier 0 is the one tier that is not geometric: a merge of tier-0 segments can stay in tier 0,
# so its biggest segment is rewritten (index and catalog re-sent; its pack read back for the
# checksum) every FANOUT - 1 pushes until it outgrows the tier. At 1 MiB a run of ~20 KB
# steps rewrote each entry ~17 times there (uploads 1.95x what it stored over 200 steps);
# at 64 KiB, 1.54x, for two more tiers (six more files at most) on a long run.
TIER0_BYTES = 64 << 10
GRACE_SECONDS = 3600


def fanout() -> int:
    """WVC_COMPACT_FANOUT, else FANOUT (0: never compact; the benchmarks compare)."""
    return int(settings.number("WVC_COMPACT_FANOUT", FANOUT))


def grace_seconds() -> float:
    """WVC_REMOTE_GRACE_SECONDS, else GRACE_SECONDS."""
    return settings.number("WVC_REMOTE_GRACE_SECONDS", GRACE_SECONDS)


def tier(size: int, fan: int) -> int:
    t, limit = 0, TIER0_BYTES
    while size >= limit:
        t += 1
        limit *= max(fan, 2)
    return t


def to_merge(existing: list, new_size: int) -> list:
    """The existing segments a new one of ``new_size`` (Segment.size) merges with (cascading)."""
    fan = fanout()
    if fan < 2:
        return []
    chosen: list = []
    size = new_size
    pool = list(existing)
    while True:
        same = [s for s in pool if tier(s.size, fan) == tier(size, fan)]
        if len(same) + 1 < fan:
            return chosen
        chosen += same
        pool = [s for s in pool if s not in same]
        size += sum(s.size for s in same)


@dataclass
class Recipe:
    """How a merged pack is made of what the remote already holds: ``pieces`` are byte ranges
    ``(remote pack's handle, offset, length)`` of its packs, or bytes only the client has (the magic,
    this push's own payloads, the index and trailer); ``checksum`` and ``size`` what the
    result must be. A backend that composes (Backend.compose) builds it without the ranges
    being sent again."""
    pieces: list
    checksum: str
    size: int

    @property
    def sent_bytes(self) -> int:
        return sum(len(p) for p in self.pieces if isinstance(p, bytes))


def merge_segments(download, old: list, new_pack: Path | None, new: Catalog,
                   work_dir: Path) -> tuple[Path | None, Catalog, Recipe | None]:
    """One segment holding ``new`` (its pack at ``new_pack``) and every object, commit and tree
    of ``old``: their packs are downloaded (``download(name, dest)``: the remote repository's),
    checked against their checksums, and their
    payloads copied verbatim (each object is verified again by whoever decodes it). Also the
    merged pack's Recipe in terms of the remote's packs."""
    sources: list[tuple[Path, list, Handle | None]] = []  # (local file, entries, the remote pack or None)
    # The remote's packs first, largest first, the push's own payloads last: the merged pack
    # then opens with one long range of a pack the remote holds (magic included), which a
    # backend that copies only large ranges (S3: parts of at least 5 MiB) can copy too.
    for seg in sorted(old, key=lambda s: -sum(e.length for e in s.entries)):
        if seg.pack is None or not seg.entries:  # (a pruned version's segment keeps its commit, no chunk)
            continue
        dest = work_dir / pack_filename(seg.pack)
        download(seg.pack, dest)
        checksum, _ = read_pack_index(dest)
        if checksum != seg.pack:
            raise CorruptObject(f"remote pack {seg.pack[:12]} does not match its name")
        sources.append((dest, seg.entries, Handle("pack", seg.pack)))
    if new_pack is not None:
        sources.append((new_pack, new.entries, None))
    merged = Catalog(None, [], dict(new.commits), dict(new.trees))
    for seg in old:
        for cid, data in seg.commits.items():
            merged.commits.setdefault(cid, data)
        tree_diff.merge_forms(merged.trees, seg.trees)  # (a whole form over a delta: model/tree_diff.py)
    if not sources:
        return None, merged, None
    writer = PackWriter(work_dir)
    seen: set[str] = set()
    ranges: list[tuple[Path, Handle | None, int, int]] = []  # where each byte run of the merged pack comes from
    try:
        entries = [e for path, source, where in sources for e in _copy_source(writer, path, source, where, seen, ranges)]
        finished = writer.finish()
    except BaseException:
        writer.abort()
        raise
    if finished is None:  # (nothing to copy after all: the catalog alone)
        return None, merged, None
    name, size = finished
    merged_path = work_dir / pack_filename(name)
    return merged_path, Catalog(name, entries, merged.commits, merged.trees), _recipe(merged_path, name, size, ranges)


DEAD_BYTES_A_PAYLOAD = 80  # what a block copy may carry besides payloads: a magic and an XET_BOUNDARY a region


def _copy_source(writer: PackWriter, path: Path, entries: list, remote_path: Handle | None, seen: set, ranges: list):
    """Copy one merged segment's payloads into ``writer``. A pack the remote holds whose
    payloads end in XET_BOUNDARY (store/packs.py), and none of which was copied already,
    goes as one block: its bytes from its start (its magic; the first one's is the merged
    pack's own) to that boundary, so Xet's chunker cuts the same chunks in it as in the pack
    and deduplicates them all. Otherwise payload by payload."""
    with open(path, "rb") as fh:
        fd = fh.fileno()
        end = marked_payload_end(fd, os.fstat(fd).st_size) if remote_path is not None and entries else None
        fresh = [e for e in entries if e.id not in seen]
        seen.update(e.id for e in fresh)
        if end is not None and len(fresh) == len(entries) \
                and end - len(MAGIC) - sum(e.length for e in entries) <= DEAD_BYTES_A_PAYLOAD * len(entries) + len(XET_BOUNDARY):
            start = len(MAGIC) if writer.offset == len(MAGIC) else 0
            ranges.append((path, remote_path, start, end - start))
            return writer.add_block(fd, start, end - start, entries, path.name)
        ranges.extend((path, remote_path, e.offset, e.length) for e in fresh)
        return copy_payloads(writer, ((e, read_payload(fd, e.offset, e.length, path.name)) for e in fresh))


def _recipe(merged: Path, checksum: str, size: int, ranges) -> Recipe:
    """The pieces of ``merged``: runs of payloads contiguous in one remote pack become one
    range; the rest (magic, local payloads, index, trailer) are bytes read from ``merged``."""
    pieces: list = []
    position = len(MAGIC)  # where the next payload sits in the merged pack
    with open(merged, "rb") as fh:
        pieces.append(read_payload(fh.fileno(), 0, len(MAGIC), merged.name))
        for local, remote_path, offset, length in ranges:
            last = pieces[-1]
            if remote_path is None:
                data = read_payload(fh.fileno(), position, length, merged.name)
                pieces[-1:] = [last + data] if isinstance(last, bytes) else [last, data]
            elif not isinstance(last, bytes) and last[0] == remote_path and last[1] + last[2] == offset:
                pieces[-1] = (remote_path, last[1], last[2] + length)
            else:
                pieces.append((remote_path, offset, length))
            position += length
        pieces.append(read_payload(fh.fileno(), position, size - position, merged.name))
    if len(pieces) > 1 and pieces[0] == MAGIC and not isinstance(pieces[1], bytes) and pieces[1][1] == len(MAGIC):
        source, _, length = pieces[1]  # every pack opens with the magic: copy it with the payloads after it
        pieces[:2] = [(source, 0, len(MAGIC) + length)]
    return Recipe(pieces, checksum, size)


def retired_record(paths: list[str]) -> tuple[str, bytes]:
    """A record of files replaced at this moment (deleted after the grace period)."""
    return retired_path(new_record_name()), canonical_json({"paths": sorted(paths)})


# When each remote's oldest retirement comes out of its grace period, as this process last
# listed the attic (url -> (oldest record's time or None, when listed)): a push lists the
# attic's records only when one may be due, not at every push.
_RETIRED_SINCE: dict[str, tuple[float | None, float]] = {}


def retired_at(url: str, record_path: str) -> None:
    """Note a retirement this process published (``record_path``: retired/<time>-...)."""
    oldest, listed = _RETIRED_SINCE.get(url, (None, 0.0))
    when = record_time(record_path)
    _RETIRED_SINCE[url] = (when if oldest is None else min(oldest, when), listed)


def purge_due(url: str) -> bool:
    """Whether a retirement on ``url`` may have passed its grace period: the oldest this
    process knows of has, or a grace period went by since it last listed the attic (another
    process's retirements are at least as young as that listing)."""
    oldest, listed = _RETIRED_SINCE.get(url, (None, 0.0))
    now, grace = time.time(), grace_seconds()
    return (oldest is not None and now - oldest >= grace) or now - listed >= grace


@dataclass
class Purge:
    """What a purge deletes: the retired files and records (``paths``), each where it is:
    still listed (``listed``) or moved to the attic (``attic``: the files, by their listed
    paths); deleting an absent file is no error."""
    paths: list[str]
    listed: list[str]
    attic: list[str]
    oldest_left: float | None  # the oldest retirement that stays, for the purge schedule


def purge_plan(repository) -> Purge | None:
    """What retired records older than the grace period list, if the refs no longer need any
    of it (None: nothing to delete). ``repository``: the RemoteRepository
    (remotes/repository.py) whose pinned state this reads, and which deletes the files
    (``RemoteRepository.purge``). The records are those listed and those in the attic (their
    files moved there)."""
    contents, state = repository.contents, repository.state
    now = time.time()
    records = {**repository.attic_records(), **contents.retired_records}
    grace = grace_seconds()
    times = {r: record_time(r) for r in records}
    old = [r for r in records if now - times[r] >= grace]
    # (until the old ones are gone, they are what is due: a purge that stops or declines
    # leaves them due at the next push)
    _RETIRED_SINCE[repository.url] = (min(times.values()) if times else None, now)
    if not old:
        return None
    doomed = {p for r in old for p in records[r] if p.startswith((PACKS, CATALOGS, PRUNED))}
    live = [s for s in contents.segments if doomed.isdisjoint(s.files)]
    if not _refs_covered(repository, live):
        return None  # a push that raced the retirement relies on a retired segment: keep it all
    paths = sorted(doomed) + [retired_path(r) for r in old]
    attic = [p for p in paths if movable(p)] if repository.backend.moves_retired else []
    young = [t for r, t in times.items() if r not in old]
    return Purge(paths, [p for p in paths if p in state.files], attic, min(young) if young else None)


def purged(url: str, purge: Purge) -> None:
    """Note that ``purge`` is done: the purge schedule's oldest retirement is the oldest left."""
    _RETIRED_SINCE[url] = (purge.oldest_left, time.time())


def _refs_covered(repository, live: list) -> bool:
    """Whether every commit, tree and chunk the refs reach is in ``live`` segments (or, for
    commits and trees, a format-1 file). A chunk in no segment at all is a base model's."""
    contents = repository.contents
    try:
        commits, trees, objects = repository.reachable()
    except WvcError as exc:
        log.debug("purge of %s skipped: what the refs reach could not be read (%s)", repository.url, exc)
        return False
    live_commits = {c for s in live for c in s.commits}
    live_trees = {t for s in live for t in s.trees}
    live_objects = {e.id for s in live for e in s.entries}
    if any(repository.loose_commit(c) is None for c in commits - live_commits):
        return False
    if any(repository.loose_tree(t) is None for t in trees - live_trees):
        return False
    return not {o for o in objects if o in contents.index} - live_objects
