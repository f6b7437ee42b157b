"""`wvc prune`: drop the weights of the versions of a run that a retention policy does not keep.

A pruned commit stays in the log: its commit, tree (the files and tensors it listed),
message, metadata, stored bytes and change statistics (computed before its weights go)
are kept, and it is marked in `pruned_commits`; reading its weights (checkout, export,
diff, merge, open) raises VersionPruned naming the nearest kept versions. The chunks only
pruned versions used are freed. A chunk a kept version needs whose delta chain runs through
a freed chunk is re-encoded against the same place in another kept version of the run, as
the kept versions' layout by estimated cost has it (store/kept_layout.py), else against the
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
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from .. import ids
from ..model import tree_diff
from ..model.versions import finite_number, first_parents
from ..codec.container import Method
from ..errors import ConcurrentUpdate, InvalidArgument, WvcError
from ..formats.dtypes import BYTES, DTYPES
from ..progress import NULL, Progress
from ..remotes import lazy_remote_name
from ..store.packs import PackWriter, copy_payloads, pack_filename
from ..store.refs import HEADS, TAGS
from ..store.rows import ObjectRow
from ..store import kept_layout
from .changes import ensure_changes, first_parent_history
from .maintenance import PRUNED_PACKS as RETIRED_PACKS, _pack_bytes, _ref_tips, reflog_expire_seconds


@dataclass(frozen=True)
class KeepPolicy:
    """Which versions of a run keep their weights. A version is kept if any rule keeps it;
    a branch's tip, every commit a ref or HEAD points at, where another branch leaves the
    run (a merge's base) and a base model's root always are."""

    last: int = 0  # the newest ``last`` versions
    every: int = 0  # versions whose step (metadata "step", else position in the run from 0) is a multiple
    tagged: bool = False  # versions a tag points at
    best: tuple[str, ...] = ()  # "METRIC" or "METRIC:min|max" (default min): the best version by each

    @classmethod
    def of(cls, keep) -> "KeepPolicy":
        """A policy from a KeepPolicy, a dict of its fields, or a string such as
        ``"last=10,every=100,tagged,best=eval_loss:min"`` (the Publisher's ``keep=``)."""
        if isinstance(keep, KeepPolicy):
            return keep.checked()
        if isinstance(keep, str):
            fields: dict = {}
            for part in filter(None, (p.strip() for p in keep.split(","))):
                key, eq, value = part.partition("=")
                if key == "tagged" and not eq:
                    fields["tagged"] = True
                elif key in ("last", "every") and eq and value.isdigit():
                    fields[key] = int(value)
                elif key == "best" and value:
                    fields["best"] = fields.get("best", ()) + (value,)
                else:
                    raise InvalidArgument(f"keep policy: {part!r} is not last=K, every=N, tagged or best=METRIC[:min|max]")
            keep = fields
        if isinstance(keep, dict):
            unknown = set(keep) - {"last", "every", "tagged", "best"}
            if unknown:
                raise InvalidArgument(f"keep policy: unknown rule {sorted(unknown)[0]!r}")
            best = keep.get("best", ())
            return cls(int(keep.get("last", 0)), int(keep.get("every", 0)), bool(keep.get("tagged", False)),
                       (best,) if isinstance(best, str) else tuple(best)).checked()
        raise InvalidArgument(f"keep policy: expected a string, a dict or a KeepPolicy, not {type(keep).__name__}")

    def checked(self) -> "KeepPolicy":
        if self.last < 0 or self.every < 0:
            raise InvalidArgument("keep policy: --keep-last and --keep-every take a count of at least 1")
        if not (self.last or self.every or self.tagged or self.best):
            raise InvalidArgument("keep policy: say what to keep (--keep-last, --keep-every, --keep-tagged, --keep-best)")
        for spec in self.best:
            metric, _, direction = spec.partition(":")
            if not metric or direction not in ("", "min", "max"):
                raise InvalidArgument(f"keep policy: --keep-best {spec!r} is not METRIC[:min|max]")
        return self

    def kept(self, run: list[str], metadata: dict[str, dict], tagged: set[str]) -> set[str]:
        """Those of ``run`` (commit ids, oldest first) this policy keeps."""
        keep = set(run[len(run) - self.last:]) if self.last else set()
        if self.every:
            keep |= {c for i, c in enumerate(run) if _step(metadata[c], i) % self.every == 0}
        if self.tagged:
            keep |= tagged.intersection(run)
        for spec in self.best:
            metric, _, direction = spec.partition(":")
            scored = [(v, i, c) for i, c in enumerate(run) if (v := metric_value(metadata[c], metric)) is not None]
            if scored:
                keep.add((max(scored) if direction == "max" else min(scored, key=lambda s: (s[0], -s[1])))[2])
        return keep


def _step(metadata: dict, position: int) -> int:
    step = metadata.get("step")
    return step if type(step) is int and step >= 0 else position


def metric_value(metadata: dict, metric: str) -> float | None:
    """A commit's value of ``metric``: metadata[metric], else metadata["metrics"][metric]
    (the Trainer callback's layout); only finite numbers count."""
    value = metadata.get(metric)
    if value is None and isinstance(metadata.get("metrics"), dict):
        value = metadata["metrics"].get(metric)
    return finite_number(value)


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
    pruned_commits: list[str] = field(default_factory=list)

    def to_json(self):
        return dict(self.__dict__)


@dataclass
class _Plan:
    kept_chunks: set[str]
    rows: dict[str, ObjectRow]  # old rows of every chunk involved and its chain
    reencode: list[tuple[str, str | None]]  # (chunk, its new base or None), bases first
    freed: set[str]  # rows to delete
    dtypes: dict[str, str]
    rebased: set[str]  # re-encoded on a new base (the rest of ``reencode`` keeps its base)


PLAN_ATTEMPTS = 3  # plans made afresh when commits landing meanwhile made the last one stale


class _StalePlan(Exception):
    """Raised under the write lock when what landed since the plan makes it unsafe to apply."""


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
            except _StalePlan as exc:
                if attempt == PLAN_ATTEMPTS:
                    raise ConcurrentUpdate(f"prune: {exc}, {PLAN_ATTEMPTS} plans in a row; nothing was changed: "
                                           "run it again (or between commits)") from None
    raise AssertionError("unreachable")


def _prune(repo, branch: str | None, policy: KeepPolicy, dry_run: bool, protect, progress: Progress) -> PruneResult:
    _finish_retired(repo)
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise InvalidArgument("HEAD is detached: name the branch to prune")
    tip = repo.refs.get(HEADS + branch)
    if tip is None:
        raise InvalidArgument(f"no branch {branch!r}")
    run = first_parent_history(repo, tip)
    metadata = {c: repo.read_commit(c).metadata for c in run}
    already = repo.graph.pruned()
    keep_set = (policy.kept(run, metadata, set(repo.refs.list(TAGS).values())) | _always_kept(repo) | set(protect)
                | _fork_points(repo, run))
    to_prune = [c for c in run if c not in keep_set and c not in already]
    result = PruneResult(branch, dry_run, len(run), sum(1 for c in run if c not in already and c not in to_prune),
                         len(to_prune), len(already.intersection(run)), bytes_before=_pack_bytes(repo),
                         pruned_commits=to_prune)
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
    new_rows, copied, pack = _write_pack(repo, plan, progress)
    # 3. one transaction
    now = int(time.time())
    try:
        with repo.db.write():
            if pack is not None and not repo.store.pack_file_intact(*pack):
                raise _StalePlan(f"its new pack {pack[0][:12]} is gone or changed before its record")
            # a ref moved onto a version meanwhile: it keeps its weights (its chunks revive below)
            pruning -= _always_kept(repo)
            to_prune = [c for c in to_prune if c in pruning]
            new_by_id = {r.id: r for r in new_rows}
            live_now, rows_now = _live(repo, already | pruning, new_by_id, plan.rows)
            depths = _corrected_depths(live_now, new_by_id, rows_now)
            _check_still_valid(plan, live_now, new_by_id, rows_now, depths, repo.max_chain)
            resurrected = plan.freed & live_now  # a commit that landed meanwhile needs them
            freed = plan.freed - resurrected
            touched = {plan.rows[o].pack for o in plan.freed} | {plan.rows[o].pack for o, _ in plan.reencode}
            emptied = touched - {plan.rows[o].pack for o in resurrected}
            repo.graph.mark_pruned(to_prune, now)
            if pack is not None:
                repo.store.relocate(pack, copied + [(r.id, r.offset) for r in new_rows], now)
                repo.store.reencoded(new_rows, plan.rebased)
            repo.store.set_depths(depths)
            repo.store.forget(freed, emptied)
            repo.db.set_config(RETIRED_PACKS, json.dumps(sorted(emptied)))
    except _StalePlan:
        if pack is not None:  # recorded nowhere: nobody else can use it
            (repo.store.packs_dir / pack_filename(pack[0])).unlink(missing_ok=True)
        raise
    repo.store.reader.close()
    # 4. the emptied packs' files
    _finish_retired(repo)
    result.chunks_freed, result.pruned, result.pruned_commits = len(freed), len(to_prune), to_prune
    result.bytes_after = _pack_bytes(repo)
    result.bytes_freed = max(0, result.bytes_before - result.bytes_after)
    return result


def _check_still_valid(plan: _Plan, live: set[str], new_rows: dict[str, ObjectRow], rows: dict[str, ObjectRow],
                       depths: dict[str, int], max_chain: int) -> None:
    """Under the write lock, before anything is applied: the plan is still safe for what the
    kept versions need now, including chunks that commits from other processes recorded since
    it was made (their rows are not in ``plan.rows``). A live ULP_STEP payload the plan does
    not re-encode is decoded in the context of its base's base: if the plan gives its base a
    new base, that payload would decode to other bytes. And a chunk the plan never saw must
    not end up deeper than ``max_chain`` because its base was re-encoded deeper. Either way
    the plan is made again, seeing them (``_StalePlan``)."""
    for oid in live:
        row = rows.get(oid)
        if oid in new_rows or row is None or row.base is None:
            continue
        moved = new_rows.get(row.base)
        if Method(row.method).uses_context and moved is not None and moved.base != rows[row.base].base:
            raise _StalePlan(f"chunk {ids.short(oid)}, recorded since the plan, is a step on {ids.short(row.base)}, "
                             "which the plan re-encodes on another base")
        if oid not in plan.rows and depths.get(oid, row.depth) > max_chain:
            raise _StalePlan(f"chunk {ids.short(oid)}, recorded since the plan, would pass max_chain")


def _always_kept(repo) -> set[str]:
    """What every ref and HEAD point at, and a base model's root."""
    base = repo.db.get_config("base.commit")
    return _ref_tips(repo) | ({base} if base else set())


def _fork_points(repo, run: list[str]) -> set[str]:
    """Where other refs' histories leave the run: the newest commit of the run each other
    ref reaches. A merge of that branch needs it as its merge base, so it keeps its weights."""
    in_run = set(run)
    out = set()
    for tip in set(repo.refs.list("refs/").values()) - in_run:
        reached = [c for c in repo.graph.ancestors(tip) if c in in_run]
        if reached:
            out.add(max(reached, key=run.index))
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


def _preferred_bases(versions: list[dict]) -> tuple[dict[str, str], dict[str, int]]:
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


def _laid_out(repo, versions: list[dict], dtypes, rows, kept: set[str], base_of, max_chain: int,
              preferred: dict[str, str]) -> set[str]:
    """Bases for the chunks of the run's kept versions from :mod:`.kept_layout` (a tree of
    kept versions by estimated cost, within ``max_chain``), written into ``preferred``; the
    chunks to re-encode onto theirs even where their chain stays (the versions it lays out
    afresh). Without a layout, ``preferred`` stays the kept version before. ``versions``: the
    places of the run's kept versions, oldest first (the newest MAX_VERSIONS are laid out)."""
    versions = versions[-kept_layout.MAX_VERSIONS:]
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
    layout = kept_layout.kept_parents(repo.store, versions, dtypes, rows, needs, max_chain, root_depth)
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


def _plan(repo, pruned: set[str], run=()) -> _Plan:
    """Which chunks stay, which go, and which of those staying must be re-encoded (their
    chain runs through one that goes): each against the same place's chunk in the run's kept
    version before (:func:`_preferred_bases`) when that keeps the chain within ``max_chain``,
    else against the nearest link of its chain that stays. Chains are followed through the
    plan's own re-encodings, bases first (the run's kept versions oldest first)."""
    dtypes: dict[str, str] = {}
    for tree in _kept_trees(repo, pruned):
        for f in tree.files:
            if f.header:
                dtypes[f.header] = BYTES.name
            dtypes.update((c, BYTES.name) for c in f.chunks)
            for t in f.tensors:
                dtypes.update((c, t.dtype) for c in t.chunks)
    kept = set(dtypes)
    dropped: set[str] = set()
    for c in pruned:
        if repo.graph.has_commit(c):
            dropped |= repo.read_tree(repo.read_commit(c).tree).chunk_ids()
    rows = repo.store.chain_rows(kept | dropped)
    new_base: dict[str, str | None] = {}

    def base_of(oid: str) -> str | None:
        if oid in new_base:
            return new_base[oid]
        row = rows.get(oid)
        return row.base if row is not None else None

    versions = _kept_places(repo, pruned, run)
    preferred, order = _preferred_bases(versions)
    max_chain = repo.max_chain
    forced = _laid_out(repo, versions, dtypes, rows, kept, base_of, max_chain, preferred)

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
    # A step payload (ULP_STEP, STEP_BLOCKS) is coded in the context of its base's base: where that base was
    # rebased, the payload is re-encoded on the same base, without a context.
    rebased = set(new_base)
    reencode += [(o, rows[o].base) for o in sorted(live, key=lambda o: rows[o].depth if o in rows else 0)
                 if o in rows and o not in rebased and rows[o].base in rebased and Method(rows[o].method).uses_context]
    freed = {o for o in rows if o not in live}
    return _Plan(kept, rows, reencode, freed, dtypes, rebased)


def _write_pack(repo, plan: _Plan, progress: Progress):
    """Step 2: re-encode, copy the live payloads of the packs that lose one; make it durable."""
    from .. import codec
    from ..codec import pool as codec_pool

    store = repo.store
    chains = {o: store.chain(o, known=plan.rows) for o, _ in plan.reencode}
    chains.update({b: store.chain(b, known=plan.rows) for _, b in plan.reencode if b is not None})

    def encode(item):
        oid, base = item
        raw = store.decode_chain(chains[oid])
        base_raw = store.decode_chain(chains[base]) if base is not None else None
        dtype = DTYPES.get(plan.dtypes[oid], BYTES)
        return oid, base, len(raw), codec.encode(raw, dtype, base_raw, device="cpu")

    writer = PackWriter(store.packs_dir)
    try:
        progress.start(len(plan.reencode), "re-encoding what kept versions need", unit="chunks")
        encoded: list = []
        for k in range(0, len(plan.reencode), 16):  # a bounded number of decoded chunks in flight
            encoded += list(codec_pool.pool().map(encode, plan.reencode[k:k + 16]))
            progress.advance(min(16, len(plan.reencode) - k))
        progress.close()
        depth: dict[str, int] = {}

        def depth_of(oid: str | None) -> int:  # the depth a row will have (bases come first)
            return -1 if oid is None else depth.get(oid, plan.rows[oid].depth if oid in plan.rows else 0)

        new_rows = []
        for oid, base, raw_size, enc in encoded:
            base = base if enc.uses_base else None
            entry = writer.add(oid, enc.payload, raw_size, int(enc.method), base)
            depth[oid] = depth_of(base) + 1
            new_rows.append(ObjectRow(oid, "", entry.offset, entry.length, raw_size, int(enc.method), base, depth[oid]))
        moving = {o for o, _ in plan.reencode}
        touched = {plan.rows[o].pack for o in plan.freed | moving}
        keep_rows = [r for r in store.rows_in_packs(touched) if r.id not in plan.freed and r.id not in moving]
        entries = copy_payloads(writer, ((r, store.reader.read(r.pack, r.offset, r.length)) for r in keep_rows))
        pack = writer.finish()
    except BaseException:
        writer.abort()
        raise
    if pack is not None:
        new_rows = [ObjectRow(r.id, pack[0], r.offset, r.length, r.raw_size, r.method, r.base, r.depth) for r in new_rows]
    return new_rows, [(e.id, e.offset) for e in entries], pack


def _live(repo, pruned: set[str], new_rows: dict[str, ObjectRow],
          old_rows: dict[str, ObjectRow]) -> tuple[set[str], dict[str, ObjectRow]]:
    """Under the write lock: every chunk the kept versions need now, through the new rows;
    and the current rows of those (the plan's, and those recorded since)."""
    kept = set()
    for tree in _kept_trees(repo, pruned):
        kept |= tree.chunk_ids()
    rows = dict(old_rows)
    rows.update(repo.store.rows([o for o in kept if o not in rows]))
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
            rows.update(repo.store.rows([row.base]))
        if row.base is not None:
            frontier.append(row.base)
    return live, rows


def _corrected_depths(live: set[str], new_rows: dict[str, ObjectRow], rows: dict[str, ObjectRow]) -> dict[str, int]:
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


def remote_prune(repo, remote_name: str, branch: str | None = None, keep=None, *, dry_run: bool = False,
                 progress: Progress = NULL, attempts: int = 5) -> PruneResult:
    """Apply ``keep`` to ``branch``'s run on a remote: the pruned commits are listed in one
    ``pruned/`` record (the union with the ones before, which it replaces), and what only they
    needed is removed as ``gc --remote`` removes garbage, by compare-and-swap against the
    listing it read (a push meanwhile makes it start over, up to ``attempts`` times). Chains
    are not re-encoded on a remote: another store may hold the same chunks, and a ULP_STEP
    payload's context is its base's base there, so a kept version keeps the links its
    chains run through (at most ``max_chain`` a chunk)."""
    from ..errors import RemoteChanged
    from .remote_config import open_remote_repository

    policy = KeepPolicy.of(keep)
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise InvalidArgument("HEAD is detached: name the branch to prune")
    for attempt in range(attempts):
        remote = open_remote_repository(repo, remote_name)
        try:
            return _remote_prune_once(repo, remote, remote_name, branch, policy, dry_run, progress)
        except RemoteChanged:
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _remote_prune_once(repo, remote, remote_name: str, branch: str, policy: KeepPolicy, dry_run: bool,
                       progress: Progress) -> PruneResult:
    import tempfile
    from pathlib import Path

    from ..model.versions import canonical_json
    from ..remotes.layout import new_record_name, pruned_path
    from .remote_gc import Cut

    tip = remote.refs.get(HEADS + branch)
    if tip is None:
        raise InvalidArgument(f"{remote_name} has no branch {branch!r}")
    run = first_parents(remote.commit, tip)[::-1]
    metadata = {c: remote.commit(c).metadata for c in run}
    contents = remote.contents
    already = remote.pruned
    tags = {t for r, t in remote.refs.items() if r.startswith(TAGS)}
    keep_set = policy.kept(run, metadata, tags) | set(remote.refs.values())
    to_prune = [c for c in run if c not in keep_set and c not in already]
    pruned = already | set(to_prune)
    live_commits, live_trees, live_objects = remote.reachable(pruned=pruned)
    cut = Cut.of(contents.live_segments, live_commits, live_trees, live_objects)
    result = PruneResult(branch, dry_run, len(run), sum(1 for c in run if c not in pruned), len(to_prune),
                         len(already.intersection(run)), chunks_freed=cut.objects_removed,
                         bytes_freed=cut.bytes_freed, pruned_commits=to_prune)
    stored = sum(seg.pack_bytes for seg in contents.live_segments)
    result.bytes_before, result.bytes_after = stored, stored - cut.bytes_freed
    if dry_run or not (to_prune or cut.dead or cut.partial):
        return result
    record = pruned_path(new_record_name())
    with tempfile.TemporaryDirectory(prefix="wvc-remote-prune-", dir=repo.wvc_dir) as tmp:
        remote.rewrite(cut.dead + cut.partial, cut.kept(live_objects, live_commits, live_trees),
                       f"wvc prune {branch}: {len(to_prune)} versions, {cut.objects_removed} objects removed",
                       Path(tmp), progress, extra={record: canonical_json({"commits": sorted(pruned)})},
                       replaced=[pruned_path(r) for r in remote.state.pruned])
    return result
