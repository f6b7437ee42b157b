"""The step records a push publishes for followers (format: remotes/step_records.py).

For each of the newest ``step_records.KEEP`` first-parent steps of the pushed branch that the push
carries, a record of what changed against the parent: each changed chunk's stored payload
when it is a delta against the parent's chunk at that place (and its step context, if it
has one, is the chunk the grandparent held there: what a follower kept), else a step
payload coded here against the parent's chunk (with the grandparent's as its context). A
re-anchored chunk is the usual case for the latter: its stored payload is coded against
its chain's anchor, and carries the drift since then; so is a keyframe, unless the step
payload is not much smaller.
"""

from __future__ import annotations

import logging
from ..errors import WvcError
from ..model import tree_diff
from ..model.versions import first_parents
from ..codec import Method, encode
from ..formats.dtypes import DTYPES
from . import step_records
from .layout import step_path
from ..lru import LRUCache

log = logging.getLogger(__name__)

BYTES = DTYPES["U8"]
STEP_GAIN = 0.8  # a step payload replaces a stored delta only if it is at most this share of it


def for_push(repo, tip: str, new_commits, others) -> "callable":
    """What ``RemoteRepository.push_segment`` calls, given where each chunk will be
    (``locate``), for the records a push of ``new_commits`` onto ``tip`` publishes and the
    commits whose records it replaces; ``others``: the remote's other branch tips (their
    records stay). A record is a shortcut (a follower without one reads the version the
    usual way), so a version none can be built for gets none, and a history this repository
    holds only in part gets none at all."""

    def records(locate) -> tuple[dict[str, bytes], list[str]]:
        built = {}
        try:
            for cid in records_for(repo, tip, new_commits):
                try:
                    data = build_record(repo, cid, locate)
                except (WvcError, ValueError, KeyError) as exc:  # (e.g. a version whose chunks a prune dropped)
                    log.debug("step records: none for %s (%s)", cid[:12], exc)
                    data = None
                if data is not None:
                    built[step_path(cid)] = data
            return built, dropped_records(repo, tip, len(new_commits), others)
        except WvcError as exc:  # (a history this repository holds only in part)
            log.debug("step records: none replaced (%s); followers read those versions the usual way", exc)
            return built, []

    return records


def records_for(repo, tip: str, new_commits) -> list[str]:
    """The commits of ``new_commits`` a push writes records for: the newest ``KEEP`` steps
    along ``tip``'s first parents (a merge's record is against its first parent)."""
    chosen, commit = [], tip
    new = set(new_commits)
    while commit in new and len(chosen) < step_records.KEEP:
        parents = repo.read_commit(commit).parents
        if not parents:
            break
        chosen.append(commit)
        commit = parents[0]
    return chosen


def dropped_records(repo, tip: str, pushed: int, others=()) -> list[str]:
    """The commits whose records a push of ``pushed`` commits to ``tip`` replaces: those that
    fall out of the newest ``KEEP`` first-parent steps now (older ones were replaced by the
    pushes before), unless among the newest ``KEEP`` of another branch (``others``: their
    tips on the remote)."""
    walked = first_parents(repo.read_commit, tip, pushed + 2 * step_records.KEEP)
    keep = set(walked[: step_records.KEEP])
    for other in others:
        if repo.graph.has_commit(other):
            keep.update(first_parents(repo.read_commit, other, step_records.KEEP))
    return [c for c in walked[step_records.KEEP :] if c not in keep]



def build_record(repo, commit_id: str, locate) -> bytes | None:
    """The record moving ``commit_id``'s first parent to it, or None when this writer makes
    none: a base model's chunk changed, or the tree changed beyond chunk ids (files, shapes,
    headers: rare steps, which a follower reads the usual way; the format could carry the
    whole tree, this writer does not).
    ``locate(id)``: (pack, PackEntry) where the remote holds that chunk after this push."""
    commit = repo.read_commit(commit_id)
    parent = commit.parents[0]
    new_tree = repo.read_tree(commit.tree)
    parent_commit = repo.read_commit(parent)
    old_tree = repo.read_tree(parent_commit.tree)
    before = parent_commit.parents
    older = tree_diff.places(repo.read_tree(repo.read_commit(before[0]).tree)) if before else {}
    diff = tree_diff.diff_trees(old_tree, new_tree)
    if diff is None:
        return None
    old, dtypes = tree_diff.places(old_tree), _dtypes(new_tree)
    held = set(old.values())  # what a follower of the parent holds: its chunks need nothing
    chunks, done = [], set()
    for path, tensor, index, cid in diff:
        if cid in held or cid in done:
            continue
        done.add(cid)
        decoded = _Decoded(repo.store.recent_decoded)  # this place's versions decoded so far: they share chains
        place = (path, tensor, index)
        base, context = old[place], older.get(place)
        if context == base:
            context = None
        row = repo.store.row(cid)
        if row is None or row.external:
            return None
        dtype = dtypes.get((path, tensor), BYTES)
        if row.base is None and (found := locate(cid)) is not None:
            # A keyframe: anyone decodes it. The anchor policy writes one when it beats every
            # delta against the chunk's anchor (store/anchors.py), or when the chain is full:
            # the step's own change is then mostly far smaller, and a follower gets that.
            stored_base, stored_context, try_step = None, None, True
        else:
            found = locate(cid) if row.base == base else None
            stored_base, stored_context = base, None
            if found is not None and Method(row.method).uses_context:
                base_row = repo.store.row(base)  # the stored payload's step context: its base's base
                stored_context = base_row.base if base_row is not None else None
                if stored_context is None or not (stored_context == context or stored_context in held):
                    found = None  # a follower would not hold it: send a step payload instead
            # The step after an anchor: its stored payload was coded without the step before
            # (its base's base is an older anchor), ~3x a step; coded with it, it is a step again.
            try_step = (found is not None and stored_context is None and context is not None
                        and _context_lost(repo, base, context))
        coded = None
        if try_step:
            coded = _step_payload(repo, cid, base, context, dtype, decoded)
            if len(coded.payload) >= STEP_GAIN * found[1].length:
                coded = None
        if found is not None and coded is None:
            pack, entry = found
            chunks.append((cid, stored_base, stored_context, row.raw_size, pack, entry.offset, entry.length, None))
            continue
        coded = coded or _step_payload(repo, cid, base, context, dtype, decoded)
        chunks.append((cid, base, context if coded.method.uses_context else None, row.raw_size, None, 0, 0,
                       coded.payload))
    return step_records.build(commit_id, parent, commit.to_bytes(), None, diff, chunks)


def _context_lost(repo, base: str, context: str) -> bool:
    """Whether ``base`` is stored against something other than ``context`` (the chunk the
    step before it held): then a payload on ``base`` had no step context to be coded in."""
    row = repo.store.row(base)
    return row is not None and row.base != context


def _step_payload(repo, cid: str, base: str, context: str | None, dtype, decoded):
    """``cid`` coded against ``base``, in the context of ``context`` where the codec can use it.
    ``decoded``: this place's chunks decoded so far (the parent's chain holds most of the
    grandparent's and often the chunk's base: decoding each chain whole, three times over,
    was most of a push's time once one step in two carried a step payload). A long-lived
    writer coded it at commit time (store.step_payloads): taken from there."""
    coded = repo.store.step_payloads.get((cid, base, context, dtype))
    if coded is not None:
        return coded
    base_raw = _raw(repo, base, decoded)
    context_raw = _raw(repo, context, decoded) if context is not None else None
    return encode(_raw(repo, cid, decoded), dtype, base_raw, context=context_raw)


def _dtypes(tree) -> dict:
    return {(f.path, t.name): DTYPES[t.dtype] for f in tree.files for t in f.tensors}


class _Decoded:
    """One place's decoded versions (``ObjectStore.get_from``'s ``known``), backed by the
    store's recent ones."""

    def __init__(self, recent: LRUCache[str, bytes]):
        self.mine: dict[str, bytes] = {}
        self.recent = recent

    def __contains__(self, oid) -> bool:
        return oid in self.mine or oid in self.recent

    def get(self, oid, default=None):
        raw = self.mine.get(oid)
        if raw is None:
            raw = self.recent.get(oid)
        return default if raw is None else raw

    def __getitem__(self, oid) -> bytes:
        raw = self.get(oid)
        if raw is None:
            raise KeyError(oid)
        return raw

    def __setitem__(self, oid, raw: bytes) -> None:
        self.mine[oid] = raw
        self.recent.put(oid, raw)


def _raw(repo, oid: str, decoded: _Decoded) -> bytes:
    """A chunk's bytes: a Publisher keeps its last two commits' raw chunks and its chains'
    anchors (no chain decoded); else decoded from the highest link in hand."""
    kept = repo.store.kept_chunk(oid)
    return kept if kept is not None else repo.store.get_from(oid, decoded)


def after_rewrite(repo, remote):
    """``rewrite``'s ``rebuilt_records``: the step records that name a payload in a pack not
    live after the rewrite (one it drops, or one an earlier compaction retired: where a backend
    deletes retired files at once, as the Hub does, a follower reading such a record finds the
    pack gone and reads the whole version the usual way), built again from this repository
    (:func:`build_record`) against where the chunks are after it. One it cannot build (a pruned
    version's: its chunks went; another writer's) stays as it was: on a backend that keeps
    retired files through the grace period it is still read."""

    def rebuild(locate, dropped_packs: set) -> dict[str, bytes]:
        live = {seg.pack for seg in remote.contents.live_segments if seg.pack is not None} - dropped_packs
        built = {}
        for commit in sorted(remote.step_records()):
            try:
                record = step_records.fetch(remote.backend, commit)
            except WvcError:  # (unusable already: built again if it can be)
                record = None
            if record is not None and all(c.pack is None or c.pack in live for c in record.chunks):
                continue
            try:
                data = build_record(repo, commit, locate)
            except (WvcError, ValueError, KeyError) as exc:  # (as a push's: e.g. a version whose chunks a prune dropped)
                log.debug("step records: none for %s again (%s)", commit[:12], exc)
                data = None
            if data is not None:
                built[step_path(commit)] = data
        return built

    return rebuild
