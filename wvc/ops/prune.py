"""`wvc prune`: drop the weights of the versions of a run that a retention policy does not keep.

A pruned commit stays in the log: its commit, tree (the files and tensors it listed),
message, metadata, stored bytes and change statistics (computed before its weights go)
are kept, and it is marked in `pruned_commits`; reading its weights (checkout, export,
diff, merge, open) raises VersionPruned naming the nearest kept versions. The chunks only
pruned versions used are freed. A chunk a kept version needs whose delta chain runs through
a freed chunk is re-encoded against the same place in another kept version of the run, as
the kept versions' layout by estimated cost has it (store/kept_bases.py), else against the
nearest link of its chain that stays, or as a keyframe.

Order (docs/design.md, "prune"): 1. the change statistics of the commits to prune and of
their children, each commit in its own transaction (a cache); 2. the re-encoded payloads,
and the live payloads of every pack that holds a freed payload, copied into one new pack,
made durable; 3. one transaction: reachability again (a commit that landed meanwhile keeps
every chunk its chain needs), the commits marked pruned, rows switched to the new pack,
freed rows and emptied packs deleted, the emptied packs' names noted in the config; 4. their
files unlinked, the note dropped. A kill before 3 leaves an orphan new pack (a leftover gc
removes after its grace period); after 3, the noted files, which the next prune or gc
unlinks. A rerun after any kill finishes the job.

The policy (which versions, and why) is ``model/keep_policy.py``; the plan over the chunk
store (what goes, what is re-encoded on which base) is ``store/prune_plan.py``; this module
says which versions no policy may prune, and runs the steps.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConcurrentUpdate, InvalidArgument, WvcError
from ..model import tree_diff
from ..model.keep_policy import KeepPolicy
from ..model.versions import first_parents
from ..progress import NULL, Progress
from ..remotes import lazy_remote_name
from ..store import prune_plan
from ..store.packs import pack_filename
from ..store.prune_plan import StalePlan
from ..store.refs import HEADS, REFS, TAGS, short_ref
from .changes import ensure_changes, first_parent_history
from ..store.config_keys import BASE_COMMIT, RETIRED_PACKS
from .maintenance import _pack_bytes, _ref_tips, reflog_expire_seconds

log = logging.getLogger(__name__)

__all__ = ["KeepPolicy", "PruneResult", "prune", "remote_prune"]


@dataclass
class PruneResult:
    branch: str
    dry_run: bool
    versions: int  # in the run (the branch's first-parent history)
    kept: int  # of them, with weights after this prune
    pruned: int  # by this prune
    already_pruned: int
    chunks_freed: int = 0
    chunks_reencoded: int = 0
    bytes_before: int = 0  # pack bytes
    bytes_after: int = 0
    bytes_freed: int = 0
    # on a remote: bytes of pruned versions' chunks left in packs that are mostly live (by a
    # periodic prune's min_dead_share), for a later prune or ``gc --remote`` to free
    bytes_left: int = 0
    pruned_commits: list[str] = field(default_factory=list)
    # each kept version of the run -> why it keeps its weights ("last 10", "every 100",
    # "tagged", "best loss (min)", "ref main", "HEAD", "base model", "fork point of exp", ...)
    kept_reasons: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self):
        return dict(self.__dict__)


PLAN_ATTEMPTS = 3  # plans made afresh when commits landing meanwhile made the last one stale


def prune(repo, branch: str | None = None, keep=None, *, dry_run: bool = False, protect=frozenset(),
          progress: Progress = NULL) -> PruneResult:
    """Apply ``keep`` (see :class:`KeepPolicy`) to ``branch``'s run (default: HEAD's branch).
    ``protect``: commits kept whatever the policy says (the Publisher's not yet pushed).

    Under the maintenance lock (no gc or other prune beside it); commits from other
    processes go on meanwhile, and a plan they made unsafe is made again (docs/design.md,
    "prune": why each race is safe)."""
    policy = KeepPolicy.of(keep)
    if lazy_remote_name(repo.db) is not None:
        raise WvcError("this is a lazy clone: `wvc fetch --all` first, so that what kept versions need is here")
    if dry_run:
        return _prune(repo, branch, policy, True, protect, progress)
    with repo.maintenance_lock("prune"):
        for attempt in range(1, PLAN_ATTEMPTS + 1):
            try:
                return _prune(repo, branch, policy, False, protect, progress)
            except StalePlan as exc:
                if attempt == PLAN_ATTEMPTS:
                    raise ConcurrentUpdate(f"prune: {exc}, {PLAN_ATTEMPTS} plans in a row; nothing was changed: "
                                           "run it again (or between commits)") from None
    raise AssertionError("unreachable")


def _prune(repo, branch: str | None, policy: KeepPolicy, dry_run: bool, protect, progress: Progress) -> PruneResult:
    _finish_retired(repo)
    tips = _ref_tips(repo)  # as the plan sees them: what a commit landing meanwhile moves
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise InvalidArgument("HEAD is detached: name the branch to prune")
    tip = repo.refs.get(HEADS + branch)
    if tip is None:
        raise InvalidArgument(f"no branch {branch!r}")
    run = first_parent_history(repo, tip)
    metadata = {c: repo.read_commit(c).metadata for c in run}
    already = repo.graph.pruned()
    reasons = _kept_reasons(repo, run, policy.reasons(run, metadata, set(repo.refs.list(TAGS).values())), protect)
    to_prune = [c for c in run if c not in reasons and c not in already]
    result = PruneResult(branch, dry_run, len(run), sum(1 for c in run if c not in already and c not in to_prune),
                         len(to_prune), len(already.intersection(run)), bytes_before=_pack_bytes(repo),
                         pruned_commits=to_prune, kept_reasons={c: reasons[c] for c in run if c in reasons})
    plan = _plan(repo, already | set(to_prune), run)
    result.chunks_freed, result.chunks_reencoded = len(plan.freed), len(plan.reencode)
    result.bytes_freed = sum(plan.rows[o].length for o in plan.freed)
    if dry_run or not (to_prune or plan.freed or plan.reencode):
        result.bytes_after = result.bytes_before - (0 if dry_run else result.bytes_freed)
        return result
    # 1. what the log shows of them must survive their weights: changes against the parent
    pruning = set(to_prune)
    first_parent = {c: (repo.read_commit(c).parents or (None,))[0] for c in run}
    ensure_changes(repo, [c for c in run if c in pruning or first_parent[c] in pruning], progress)
    # 2. the new pack: re-encoded payloads, and the live payloads of the packs freed objects are in
    new_rows, copied, pack = prune_plan.write_pack(repo.store, plan, progress)
    new_by_id = {r.id: r for r in new_rows}
    rebased = plan.rebased | _base_changed(new_rows, plan.rows)
    written: list[tuple[str, int]] = []  # the catch-up's packs
    caught_up: list = []
    now = int(time.time())
    try:
        # 2b. what commits recorded since the plan need re-encoded (the catch-up), as far as it
        # goes before the write lock: under it, only what lands meanwhile is left. A round only
        # when a ref moved (every commit moves one): a prune beside no training reads the kept
        # trees once more, under the lock, as before.
        for _ in range(CATCH_UP_UNLOCKED_ROUNDS):
            if (moved := _ref_tips(repo)) == tips:
                break
            tips = moved
            trees_now = _kept_trees(repo, already | pruning)
            live_now, rows_now = _live_now(repo, trees_now, new_by_id, plan)
            caught_up += _catch_up(repo, trees_now, live_now, new_by_id, rows_now, rebased, written)
        # 3. one transaction
        with repo.db.write():
            if pack is not None and not repo.store.pack_file_intact(*pack):
                raise StalePlan(f"its new pack {pack[0][:12]} is gone or changed before its record")
            # a ref moved onto a version meanwhile: it keeps its weights (its chunks revive below)
            pruning -= _always_kept(repo)
            to_prune = [c for c in to_prune if c in pruning]
            trees_now = _kept_trees(repo, already | pruning)
            live_now, rows_now = _live_now(repo, trees_now, new_by_id, plan)
            caught_up += _catch_up(repo, trees_now, live_now, new_by_id, rows_now, rebased, written,
                                   locked_bytes=CATCH_UP_LOCKED_BYTES)
            depths = prune_plan.corrected_depths(live_now, new_by_id, rows_now)
            prune_plan.check_still_valid(plan, live_now, new_by_id, rows_now, depths, repo.max_chain)
            resurrected = plan.freed & live_now  # a commit that landed meanwhile needs them
            freed = plan.freed - resurrected
            touched = {plan.rows[o].pack for o in plan.freed} | {plan.rows[o].pack for o, _ in plan.reencode}
            emptied = touched - {plan.rows[o].pack for o in resurrected}
            repo.graph.mark_pruned(to_prune, now)
            if pack is not None:
                repo.store.relocate(pack, copied + [(r.id, r.offset) for r in new_rows], now)
                repo.store.reencoded(new_rows, rebased)
            for rows_, pack_ in caught_up:
                repo.store.relocate(pack_, [(r.id, r.offset) for r in rows_], now)
                repo.store.reencoded(rows_, rebased)
            repo.store.set_depths(depths)
            repo.store.forget(freed, emptied)
            repo.db.set_config(RETIRED_PACKS, json.dumps(sorted(emptied)))
    except StalePlan:
        for name, _ in ([pack] if pack is not None else []) + written:  # recorded nowhere: nobody else can use them
            (repo.store.packs_dir / pack_filename(name)).unlink(missing_ok=True)
        raise
    repo.store.reader.close()
    # 4. the emptied packs' files
    _finish_retired(repo)
    result.chunks_freed, result.pruned, result.pruned_commits = len(freed), len(to_prune), to_prune
    result.chunks_reencoded += sum(len(rows) for rows, _ in caught_up)
    result.bytes_after = _pack_bytes(repo)
    result.bytes_freed = max(0, result.bytes_before - result.bytes_after)
    return result


CATCH_UP_ROUNDS = 8  # a round re-encodes the steps on what the last one put on a new base (a few at most)
CATCH_UP_UNLOCKED_ROUNDS = 3  # catch-ups before the write lock, each seeing the commits that landed during the last
# Under the write lock commits wait (SQLite's busy timeout, 30 s): re-encoding more than this
# there (a dense step of a large model landed after the last catch-up before it) makes the plan
# stale instead; it is made again, and after 3 the prune refuses, rather than fail a commit.
CATCH_UP_LOCKED_BYTES = 256 << 20


def _live_now(repo, trees, new_by_id: dict, plan):
    """Every chunk ``trees`` need now, through the re-encoded rows, and their current rows."""
    kept = set().union(*(t.chunk_ids() for t in trees))
    return prune_plan.live_chunks(repo.store, kept, new_by_id, plan.rows)


def _catch_up(repo, trees, live, new_by_id: dict, rows: dict, rebased: set[str], written: list,
              locked_bytes: int | None = None) -> list:
    """Re-encode the chunks recorded since the plan that it would break (``prune_plan.catch_up``),
    each round into a pack of its own (appended to ``written``); ``new_by_id`` and ``rebased``
    grow with them. ``locked_bytes``: under the write lock, the most raw bytes it may
    re-encode (StalePlan past it). -> [(rows, pack)]."""
    out = []
    dtypes = None
    spent = 0
    for _ in range(CATCH_UP_ROUNDS):
        fixes = prune_plan.catch_up(rebased, live, new_by_id, rows, repo.max_chain)
        if not fixes.items:
            break
        spent += sum(rows[o].raw_size for o, _ in fixes.items)
        if locked_bytes is not None and spent > locked_bytes:
            raise StalePlan(f"{len(fixes.items)} chunks recorded since the plan need re-encoding, more than "
                            f"{locked_bytes >> 20} MiB to re-encode while commits wait")
        dtypes = dtypes or prune_plan.live_dtypes(trees, rows)
        new_rows, pack = prune_plan.write_catch_up(repo.store, fixes, new_by_id, rows, dtypes)
        if pack is None:
            break
        written.append(pack)
        log.debug("prune: %d chunks recorded since the plan re-encoded%s", len(new_rows),
                  " under the write lock" if locked_bytes is not None else "")
        rebased |= fixes.rebased | _base_changed(new_rows, rows)
        new_by_id.update((r.id, r) for r in new_rows)
        out.append((new_rows, pack))
    return out


def _base_changed(new_rows, rows: dict) -> set[str]:
    """Re-encoded chunks whose base is not the one they had (a codec may store a keyframe
    where a delta would not pay): a step on them needs a new context too."""
    return {r.id for r in new_rows if r.id in rows and rows[r.id].base != r.base}


def _plan(repo, pruned: set[str], run) -> prune_plan.PrunePlan:
    """The plan for pruning ``pruned`` (ids of commits): what the kept trees, the pruned
    versions' chunks and the run's kept versions are, handed to the store's planner."""
    dropped: set[str] = set()
    for c in pruned:
        if repo.graph.has_commit(c):
            dropped |= repo.read_tree(repo.read_commit(c).tree).chunk_ids()
    return prune_plan.plan(repo.store, _kept_trees(repo, pruned), dropped, _kept_places(repo, pruned, run),
                           repo.max_chain)


def _kept_reasons(repo, run: list[str], by_policy: dict[str, list[str]], protect) -> dict[str, list[str]]:
    """Why each kept version of ``run`` keeps its weights: the policy's rules (``by_policy``),
    and what no policy prunes: a ref's or HEAD's commit, the base model's root, where another
    ref's history leaves the run, and ``protect`` (the Publisher's versions not pushed yet)."""
    in_run = set(run)
    out = {c: list(why) for c, why in by_policy.items()}

    def keep(commit: str, why: str) -> None:
        if commit in in_run:
            out.setdefault(commit, []).append(why)

    for ref, target in sorted(repo.refs.list(REFS).items()):
        keep(target, "ref " + short_ref(ref))
    if head := repo.refs.head_commit():
        keep(head, "HEAD")
    if base := repo.db.get_config(BASE_COMMIT):
        keep(base, "base model")
    for commit, ref in _fork_points(repo, run).items():
        keep(commit, f"fork point of {short_ref(ref)}")
    for commit in protect:
        keep(commit, "protected (not pushed yet)")
    return out


def _always_kept(repo) -> set[str]:
    """What every ref and HEAD point at, and a base model's root."""
    base = repo.db.get_config(BASE_COMMIT)
    return _ref_tips(repo) | ({base} if base else set())


def _fork_points(repo, run: list[str]) -> dict[str, str]:
    """Where other refs' histories leave the run: the newest commit of the run each other
    ref reaches (-> that ref). A merge of that branch needs it as its merge base, so it keeps
    its weights."""
    in_run, position = set(run), {c: i for i, c in enumerate(run)}
    out: dict[str, str] = {}
    for ref, tip in sorted(repo.refs.list(REFS).items()):
        if tip in in_run:
            continue
        reached = [c for c in repo.graph.ancestors(tip) if c in in_run]
        if reached:
            out.setdefault(max(reached, key=position.__getitem__), ref)
    return out


def _finish_retired(repo) -> None:
    """Unlink the packs the last prune's transaction dropped (step 4; a rerun after a kill)."""
    noted = repo.db.get_config(RETIRED_PACKS)
    if noted is None:
        return
    known = set(repo.store.pack_names())
    for name in json.loads(noted):
        if name not in known:  # (never a pack a later write recorded again)
            (repo.store.packs_dir / pack_filename(name)).unlink(missing_ok=True)
    with repo.db.write():
        repo.db.delete_config(RETIRED_PACKS)


def _kept_trees(repo, pruned: set[str]) -> list:
    """The trees of every commit a ref, HEAD or a recent reflog entry reaches, less the pruned."""
    now = int(time.time())
    expire = reflog_expire_seconds()
    starts = _always_kept(repo)
    if expire > 0:
        starts |= {c for c in repo.refs.reflog_commits(now - expire) if repo.graph.has_commit(c)}
    commits = set(repo.graph.ancestors(starts)) - pruned
    return [repo.read_tree(t) for t in {repo.read_commit(c).tree for c in commits}]


def _kept_places(repo, pruned: set[str], run) -> list[dict]:
    """The places (``tree_diff.places``) of the run's kept versions, oldest first."""
    return [tree_diff.places(repo.read_tree(repo.read_commit(c).tree))
            for c in run if c not in pruned and repo.graph.has_commit(c)]


def remote_prune(repo, remote_name: str, branch: str | None = None, keep=None, *, dry_run: bool = False,
                 progress: Progress = NULL, attempts: int = 5, protect=frozenset(),
                 min_dead_share: float = 0.0) -> PruneResult:
    """Apply ``keep`` to ``branch``'s run on a remote (``protect``: commits kept whatever the
    policy says: a trainer's start version, which its servers may start from): the pruned
    commits are listed in one ``pruned/`` record (the union with the ones before, which it replaces), and what only they
    needed is removed as ``gc --remote`` removes garbage, by compare-and-swap against the
    listing it read (a push meanwhile makes it start over, up to ``attempts`` times). Where
    this repository's own prune re-encoded a kept version's chunk onto a kept base, the remote
    takes that payload in place of its own (remotes/rebase_plan.py), when that leaves it
    smaller; otherwise a kept version keeps the links its remote chains run through (at most
    ``max_chain`` a chunk). Step records naming a pack the rewrite retires are built again.
    ``min_dead_share``: a pack that keeps
    live chunks is rewritten only once this share of it is dead (a prune every few versions:
    integrations/publisher.PERIODIC_DEAD_SHARE); below it, the pruned versions' chunks stay in it
    (``bytes_left``) for a later prune."""
    from ..errors import RemoteChanged
    from .remote_config import open_remote_repository

    policy = KeepPolicy.of(keep)
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise InvalidArgument("HEAD is detached: name the branch to prune")
    for attempt in range(attempts):
        remote = open_remote_repository(repo, remote_name)
        try:
            return _remote_prune_once(repo, remote, remote_name, branch, policy, dry_run, progress, protect,
                                      min_dead_share)
        except RemoteChanged:
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _remote_prune_once(repo, remote, remote_name: str, branch: str, policy: KeepPolicy, dry_run: bool,
                       progress: Progress, protect=frozenset(), min_dead_share: float = 0.0) -> PruneResult:
    import tempfile

    from ..remotes import segment, step_record_writer
    from ..remotes.catalog import Catalog
    from .remote_gc import Cut

    tip = remote.refs.get(HEADS + branch)
    if tip is None:
        raise InvalidArgument(f"{remote_name} has no branch {branch!r}")
    run = first_parents(remote.commit, tip)[::-1]
    metadata = {c: remote.commit(c).metadata for c in run}
    contents = remote.contents
    already = remote.pruned
    tags = {t for r, t in remote.refs.items() if r.startswith(TAGS)}
    reasons = policy.reasons(run, metadata, tags)
    in_run = set(run)
    for ref, target in sorted(remote.refs.items()):
        if target in in_run:
            reasons.setdefault(target, []).append("ref " + short_ref(ref))
    for commit in protect:
        if commit in in_run:
            reasons.setdefault(commit, []).append("protected")
    to_prune = [c for c in run if c not in reasons and c not in already]
    pruned = already | set(to_prune)
    live_commits, live_trees, needed = remote.reachable(pruned=pruned, closed=False)
    taken, live_objects = _rebased_here(repo, remote, needed)
    cut = Cut.of(contents.live_segments, live_commits, live_trees, live_objects, min_dead_share=min_dead_share,
                 replaced=set(taken))
    rows = [taken[oid] for oid in sorted(taken)]
    result = PruneResult(branch, dry_run, len(run), sum(1 for c in run if c not in pruned), len(to_prune),
                         len(already.intersection(run)), chunks_freed=cut.objects_removed - len(taken),
                         chunks_reencoded=len(taken), bytes_freed=cut.bytes_freed - sum(r.length for r in rows),
                         bytes_left=cut.bytes_left, pruned_commits=to_prune,
                         kept_reasons={c: reasons[c] for c in run if c in reasons})
    stored = sum(seg.pack_bytes for seg in contents.live_segments)
    result.bytes_before, result.bytes_after = stored, stored - result.bytes_freed
    if dry_run or not (to_prune or cut.dead or cut.partial):
        return result
    with tempfile.TemporaryDirectory(prefix="wvc-remote-prune-", dir=repo.wvc_dir) as tmp:
        new = None
        if rows:
            path, name, entries = segment.pack_of(repo.store, rows, Path(tmp))
            new = path, Catalog(name, entries)
        remote.rewrite(cut.dead + cut.partial, cut.kept(live_objects - set(taken), live_commits, live_trees),
                       f"wvc prune {branch}: {len(to_prune)} versions, {cut.objects_removed} objects removed"
                       + (f", {len(taken)} re-encoded" if taken else ""),
                       Path(tmp), progress, pruned=pruned, new=new,
                       rebuilt_records=step_record_writer.after_rewrite(repo, remote))
    return result


def _rebased_here(repo, remote, needed: set[str]) -> tuple[dict, set[str]]:
    """Of the chunks the remote's kept versions need, those it takes as this repository's
    packs hold them (remotes/rebase_plan.py: re-encoded here by a local prune onto kept bases,
    where the remote's chains still run through pruned versions), by id with their local
    rows, and every chunk live then.
    (The step records that name a payload in a pack the rewrite drops are built again:
    remotes/step_record_writer.after_rewrite.)"""
    from ..remotes import rebase_plan

    index, rows = remote.index, {}

    def remote_rep(oid):
        found = index.get(oid)
        return rebase_plan.Rep(found[1].base, found[1].method, found[1].length) if found is not None else None

    def local_rep(oid):
        if oid not in rows:
            row = repo.store.row(oid)
            rows[oid] = None if row is None or row.external else row
        row = rows[oid]
        return None if row is None else rebase_plan.Rep(row.base, row.method, row.length)

    taken, live = rebase_plan.plan(needed, remote_rep, local_rep)
    as_is = remote.closure(needed)
    # (a local re-encoding without its step context can cost more than the steps it replaces)
    if not taken or rebase_plan.stored_bytes(live, taken, remote_rep) >= rebase_plan.stored_bytes(as_is, {}, remote_rep):
        return {}, as_is
    return {oid: rows[oid] for oid in taken}, live
