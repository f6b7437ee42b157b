"""Maintenance: gc (drop unreachable objects, repack, remove leftovers), fsck, stats.

gc order: new pack durable -> one transaction switches object rows to it and deletes
unreachable rows -> old pack files unlinked. A crash before the transaction leaves an
orphan new pack; after it, orphan old packs. Both are leftovers a later gc removes. Files
younger than the grace period are kept: they may belong to a commit still running.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from dataclasses import dataclass, field

from ..store.config_keys import BASE_DIR, RETIRED_PACKS
from .. import settings
from .. import ids
from ..errors import WvcError
from ..fsutil import TEMP_PREFIX, stale_work_dirs, temp_in_use
from ..repo import INIT_PREFIX
from ..model.versions import Commit, Tree
from ..basemodel.setup import verify as verify_base
from ..remotes import lazy_remote_name
from ..store.chains import close_over_bases
from ..store.packs import pack_filename, read_pack_index
from ..store.refs import HEADS, REFS, TAGS


# As git's gc.reflogExpireUnreachable: a commit left behind by a reset, an amend, a deleted
# branch or a rebase stays recoverable (`wvc reflog`, `main@{1}`) this long. WVC_REFLOG_EXPIRE_DAYS.
REFLOG_EXPIRE_DAYS = 30


def reflog_expire_seconds() -> int:
    return int(settings.number("WVC_REFLOG_EXPIRE_DAYS", REFLOG_EXPIRE_DAYS) * 86400)


def reachable(repo, since: int | None = None) -> tuple[set[str], set[str], set[str]]:
    """(commits, trees, objects) reachable from every ref and HEAD, and from the reflog
    entries recorded at or after ``since`` (unix time; None: not from the reflog); objects
    include delta bases. A pruned commit's tree is kept (the log lists its files), its
    chunks are not (ops/prune.py)."""
    starts = _ref_tips(repo)
    if since is not None:
        starts |= {c for c in repo.refs.reflog_commits(since) if repo.graph.has_commit(c)}
    commits = set(repo.graph.ancestors(starts))
    pruned = repo.graph.pruned()
    trees = {repo.read_commit(c).tree for c in commits}
    objects = set()
    for t in {repo.read_commit(c).tree for c in commits - pruned}:
        objects |= repo.read_tree(t).chunk_ids()
    def base_of(oid: str) -> str | None:
        row = repo.store.row(oid)
        return row.base if row is not None else None

    return commits, trees, close_over_bases(objects, base_of)


@dataclass
class GcResult:
    commits_removed: int = 0
    kept_by_reflog: int = 0  # commits no ref reaches, kept because the reflog names them
    kept_young_objects: int = 0  # unreachable, in packs younger than the grace period
    reflog_days: float = REFLOG_EXPIRE_DAYS
    grace_seconds: int = 3600
    objects_removed: int = 0
    packs_rewritten: int = 0
    files_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    def to_json(self):
        return dict(self.__dict__)


def _ref_tips(repo) -> set[str]:
    """The commits every ref and HEAD point at."""
    tips = set(repo.refs.list(REFS).values())
    if head := repo.refs.head_commit():
        tips.add(head)
    return tips


def _pack_bytes(repo) -> int:
    return sum(p.stat().st_size for p in repo.store.packs_dir.glob("pack-*.pack"))


def gc(repo, *, grace_seconds: int = 3600) -> GcResult:
    """Under the maintenance lock: never beside a prune, whose new pack is a file no row names
    until its transaction, and whose plan reads the rows gc rewrites (docs/design.md, "gc")."""
    with repo.maintenance_lock("gc"):
        return _gc(repo, grace_seconds)


def _gc(repo, grace_seconds: int) -> GcResult:
    result = GcResult(bytes_before=_pack_bytes(repo), grace_seconds=grace_seconds,
                      reflog_days=reflog_expire_seconds() / 86400)
    now = time.time()
    expire = reflog_expire_seconds()
    since = int(now) - expire if expire > 0 else None  # 0: the reflog keeps nothing
    # Phase 1, from a snapshot: which old packs hold unreachable objects; copy their live
    # objects into a new pack. Nothing is deleted yet.
    _, _, live = reachable(repo, since)
    packs = repo.store.pack_ages()
    old_packs = {n for n, created in packs.items() if now - created >= grace_seconds}
    rows = repo.store.object_packs()
    dead_ids = {oid for oid, pack in rows if oid not in live and pack in old_packs}
    result.kept_young_objects = sum(1 for oid, pack in rows if oid not in live and pack not in old_packs)
    dead_packs = {pack for oid, pack in rows if oid in dead_ids}

    new_pack, moved = None, []
    if dead_packs:
        new_pack, moved = repo.store.copy_to_new_pack(
            row for row in repo.store.rows_in_packs(dead_packs) if row.id not in dead_ids)
    # Phase 2, under the write lock (committers wait): reachability again, from the refs as
    # they are now, and only then delete. A commit that landed meanwhile, or an object a
    # commit deduplicated against, is reachable here and survives.
    with repo.db.write():
        repo.refs.expire_reflog(since if since is not None else int(now) + 1)
        commits, _, live_now = reachable(repo, since)
        result.kept_by_reflog = len(commits - set(repo.graph.ancestors(_ref_tips(repo))))
        resurrected = dead_ids & live_now
        kept_packs = {p for oid, p in rows if oid in resurrected}
        if new_pack:
            repo.store.relocate(new_pack, moved, int(now))
        repo.store.forget(dead_ids - resurrected, dead_packs - kept_packs)
        dead_commits = [c for c in repo.graph.commit_ids() if c not in commits]
        repo.graph.delete_commits(dead_commits)
        repo.graph.delete_unreferenced_trees()
    repo.store.reader.close()
    result.commits_removed = len(dead_commits)
    result.objects_removed = len(dead_ids - resurrected)
    result.packs_rewritten = len(dead_packs - kept_packs)
    noted = repo.db.get_config(RETIRED_PACKS)  # a prune killed before unlinking them
    pruned_packs = set(json.loads(noted)) - set(repo.store.pack_names()) if noted else set()
    with repo.db.write():  # no writer records a pack between the listing of known ones and the unlinks
        result.files_removed = _remove_leftovers(repo, now, grace_seconds, (dead_packs - kept_packs) | pruned_packs)
        if noted:
            repo.db.delete_config(RETIRED_PACKS)
    result.bytes_after = _pack_bytes(repo)
    return result


def _remove_leftovers(repo, now: float, grace_seconds: int, retired: set[str]) -> int:
    """Unlink packs this gc retired, and leftovers older than the grace period."""
    known = {pack_filename(n) for n in repo.store.pack_names()}
    retired_files = {pack_filename(n) for n in retired}
    removed = 0
    for path in leftovers(repo, known):
        try:
            old = now - path.stat().st_mtime >= grace_seconds
        except FileNotFoundError:  # renamed into place by a commit finishing right now
            continue
        if path.name.startswith(TEMP_PREFIX) and temp_in_use(path):
            continue  # a live writer's (fsutil.claim_temp), whatever the grace period
        if path.name in retired_files or old or path.parent == repo.wvc_dir:  # work dirs: owner gone
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
    return removed


def leftovers(repo, known: set[str] | None = None):
    """Pack files the database does not know, temp files of interrupted writes (in .wvc and
    in the working tree, where a killed checkout leaves its half-written file), and work
    directories of killed fetches and pushes. A nested repository's files are its own."""
    if known is None:
        known = {pack_filename(n) for n in repo.store.pack_names()}
    for path in sorted(repo.store.packs_dir.iterdir()):
        if path.name.startswith(TEMP_PREFIX) or (path.name.startswith("pack-") and path.name not in known):
            yield path
    yield from stale_work_dirs(repo.wvc_dir)
    for dirpath, dirnames, filenames in os.walk(repo.root):
        if dirpath == str(repo.root):
            dirnames[:] = [d for d in dirnames if d != ".wvc"]
            yield from (Path(dirpath, d) for d in dirnames if d.startswith(INIT_PREFIX))
        dirnames[:] = [d for d in dirnames if not d.startswith(TEMP_PREFIX)
                       and not os.path.isdir(os.path.join(dirpath, d, ".wvc"))]  # nested repositories
        for name in filenames:
            full = os.path.join(dirpath, name)
            if name.startswith(TEMP_PREFIX) and not os.path.islink(full):
                yield Path(full)


@dataclass
class FsckResult:
    errors: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    commits: int = 0
    objects: int = 0
    packs: int = 0
    base_objects: int = 0  # chunks read in place from the base's files
    not_fetched: set = field(default_factory=set)  # lazy clone: chunks still only on the remote

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self):
        return {"ok": self.ok, **self.__dict__, "not_fetched": len(self.not_fetched)}


def fsck(repo) -> FsckResult:
    import sqlite3

    res = FsckResult()
    try:
        integrity = repo.db.integrity_check()
    except sqlite3.DatabaseError as exc:
        res.errors.append(f"database: {exc}")
        return res
    if integrity != "ok":
        res.errors.append(f"database: {integrity}")
    for name in repo.store.pack_names():
        res.packs += 1
        path = repo.store.packs_dir / pack_filename(name)
        try:
            checksum, _ = read_pack_index(path)
            if checksum != name:
                res.errors.append(f"pack {name[:12]}: name does not match its checksum")
        except (WvcError, OSError) as exc:
            res.errors.append(f"pack {name[:12]}: {exc}")
    lazy = lazy_remote_name(repo.db) is not None
    pruned = repo.graph.pruned()  # their trees stay, their chunks are gone on purpose
    for oid in repo.store.object_ids():
        res.objects += 1
        try:
            repo.store.get(oid)
        except WvcError as exc:
            res.errors.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - fsck reports damage, it must not die of it
            res.errors.append(f"object {ids.short(oid)}: {type(exc).__name__}: {exc}")
    for cid, data in repo.graph.raw_commits():
        res.commits += 1
        try:
            c = Commit.from_bytes(data, expected_id=cid)
            tree_data = repo.graph.tree_bytes(c.tree)
            if tree_data is None:
                res.errors.append(f"commit {ids.short(cid)}: tree {ids.short(c.tree)} missing")
                continue
            tree = Tree.from_bytes(tree_data, expected_id=c.tree)
            if cid in pruned:
                continue
            missing = [o for o in tree.chunk_ids() if not repo.store.has(o)]
            if missing and lazy:
                res.not_fetched.update(missing)  # a lazy clone's promise: on the remote, fetched on use
            elif missing:
                res.errors.append(f"commit {ids.short(cid)}: {len(missing)} objects missing, e.g. {ids.short(missing[0])}")
        except WvcError as exc:
            res.errors.append(f"commit {ids.short(cid)}: {exc}")
    for error in verify_base(repo):  # the base's files, read in place: still what was indexed?
        if error not in res.errors:
            res.errors.append(error)
    res.base_objects = repo.store.count_external()
    for name, target in repo.refs.list(REFS).items():
        if not repo.graph.has_commit(target):
            res.errors.append(f"ref {name} points to missing commit {ids.short(target)}")
    res.leftovers = [os.path.relpath(p, repo.root) for p in leftovers(repo)]
    return res


def stats(repo) -> dict:
    commits = repo.graph.count()
    logical_total = 0
    base = repo.base()
    for cid, tree in repo.graph.trees_of_commits():
        if base is None or cid != base.commit:  # the base costs nothing: it is not in the ratio
            logical_total += tree.logical_bytes
    stored = _pack_bytes(repo)
    head = repo.refs.head_commit()
    by_method = repo.store.bytes_by_method()
    from ..codec.container import Method

    return {
        "base": {**base.to_json(), "bytes": repo.read_tree(base.tree).logical_bytes,
                 "dir": repo.db.get_config(BASE_DIR)} if base else None,
        "commits": commits,
        "branches": len(repo.refs.list(HEADS)),
        "tags": len(repo.refs.list(TAGS)),
        "objects": repo.store.count_objects(),
        "packs": repo.store.count_packs(),
        "head_logical_bytes": repo.tree_of("HEAD").logical_bytes if head else 0,
        "logical_bytes": logical_total,
        "stored_bytes": stored,
        "ratio": (logical_total / stored) if stored else None,
        "objects_by_method": {Method(m).name.lower(): {"objects": n, "bytes": b} for m, (n, b) in by_method.items()},
    }
