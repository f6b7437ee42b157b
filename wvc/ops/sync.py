"""Sync: remote add/remove/list, push, fetch, pull and clone.

push:  objects the remote lacks (closed over delta bases) go up in one new pack, with the
       commits and trees; the branch moves last, by compare-and-swap against the remote
       state read at the start. Not a fast-forward: refused unless ``force``.
fetch: refs -> missing commits (verified against their ids) -> missing trees (verified)
       -> the packs holding missing chunks, downloaded and checked (pack checksum, every
       object decoded and hashed) -> one local transaction records it all and moves the
       remote-tracking refs ``refs/remotes/<remote>/<branch>``. Nothing unverified is
       ever recorded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import ids
from ..errors import CorruptObject, RevisionNotFound, WvcError
from ..fsutil import atomic_write, fsync_dir
from ..objects import Commit, Tree, canonical_json
from ..progress import NULL, Progress
from ..remotes import open_remote
from ..remotes.base import (
    BASE_RECORD,
    MAX_INDEX_BYTES,
    MAX_SMALL_OBJECT,
    NonFastForward,
    RemoteError,
    commit_path,
    pack_path,
    parse_pack_index,
    tree_path,
)
from ..store.objects import ObjectRow, decode_verified
from ..store.packs import PackEntry, PackWriter, pack_filename, read_pack_index
from ..store.refs import HEADS, check_ref_name

REMOTES = "refs/remotes/"
MAX_PACK_BYTES = 64 << 30


# -- configuration --------------------------------------------------------------------------
def remote_add(repo, name: str, url: str) -> None:
    check_ref_name(name, "remote")
    with repo.db.write():
        if repo.db.get_config(f"remote.{name}.url") is not None:
            raise WvcError(f"remote {name!r} already exists")
        repo.db.set_config(f"remote.{name}.url", url)


def remote_remove(repo, name: str) -> None:
    with repo.db.write():
        if repo.db.get_config(f"remote.{name}.url") is None:
            raise WvcError(f"no remote named {name!r}")
        repo.db.conn.execute("DELETE FROM config WHERE key = ?", (f"remote.{name}.url",))
        for branch in repo.refs.list(f"{REMOTES}{name}/"):
            repo.refs.delete(f"{REMOTES}{name}/{branch}", "remote removed")


def remotes(repo) -> dict[str, str]:
    rows = repo.db.query("SELECT key, value FROM config WHERE key LIKE 'remote.%.url' ORDER BY key")
    return {k[len("remote."):-len(".url")]: v for k, v in rows}


def open_remote_named(repo, name: str):
    url = repo.db.get_config(f"remote.{name}.url")
    if url is None:
        raise WvcError(f"no remote named {name!r} (see `wvc remote add`)")
    return open_remote(url)


# -- graph helpers --------------------------------------------------------------------------
def _has_commit(repo, cid: str) -> bool:
    return repo.db.one("SELECT 1 FROM commits WHERE id = ?", (cid,)) is not None


def ancestors(repo, start: str, stop: set[str] = frozenset()) -> list[str]:
    """Local commits reachable from ``start``, not walking past ``stop``."""
    out, seen, stack = [], set(), [start]
    while stack:
        cid = stack.pop()
        if cid in seen or cid in stop or not _has_commit(repo, cid):
            continue
        seen.add(cid)
        out.append(cid)
        stack.extend(repo.read_commit(cid).parents)
    return out


def is_ancestor(repo, old: str, new: str) -> bool:
    return old == new or old in set(ancestors(repo, new))


# -- base models ---------------------------------------------------------------------------------
def remote_base(state, url: str):
    """The base a remote records (validated), or None."""
    from .base_model import BaseError, parse_base_json

    if state.base is None:
        return None
    try:
        return parse_base_json(state.base)
    except BaseError as exc:
        raise RemoteError(f"{url}: {exc}") from None


def _check_same_base(repo, remote_name: str, theirs, ours) -> None:
    if theirs is None or theirs == ours:
        return
    if ours is None:
        raise RemoteError(f"remote {remote_name} is based on {theirs.url}; this repository has no base "
                          f"(clone the remote instead, or `wvc init --base {theirs.url}`)")
    raise RemoteError(f"remote {remote_name} is based on {theirs.url}, this repository on {ours.url}")


# -- remote pack indexes (immutable, cached locally) -----------------------------------------
def remote_index(repo, remote, name: str) -> list[PackEntry]:
    cache = repo.wvc_dir / "remote-idx" / f"{name}.idx"
    data = cache.read_bytes() if cache.is_file() else None
    if data is None:
        data = remote.read(pack_path(name, "idx"), MAX_INDEX_BYTES)
        if data is None:
            raise RemoteError(f"remote pack index {name[:12]} is missing")
    entries = parse_pack_index(data, name)
    if not cache.is_file():
        cache.parent.mkdir(exist_ok=True)
        atomic_write(cache, data, durable=False)
    return entries


# -- push -------------------------------------------------------------------------------------
@dataclass
class PushResult:
    remote: str
    branch: str
    old: str | None
    new: str
    commits: int
    objects: int
    uploaded_bytes: int
    forced: bool
    logical_bytes: int = 0  # size of the pushed version's files: what a full upload would send

    def to_json(self):
        return dict(self.__dict__)


def push(repo, remote_name: str = "origin", branch: str | None = None, *, force: bool = False,
         progress: Progress = NULL) -> PushResult:
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise WvcError("HEAD is detached: name the branch to push")
    local = repo.refs.get(HEADS + branch)
    if local is None:
        raise RevisionNotFound(f"no local branch {branch!r}")
    remote = open_remote_named(repo, remote_name)
    state = remote.state(create=True)
    ours, theirs = repo.base(), remote_base(state, remote.url)
    _check_same_base(repo, remote_name, theirs, ours)
    ref = HEADS + branch
    old = state.refs.get(ref)
    logical = repo.read_tree(repo.read_commit(local).tree).logical_bytes
    if old == local:
        return PushResult(remote_name, branch, old, local, 0, 0, 0, False, logical)
    if old is not None and not force and not (_has_commit(repo, old) and is_ancestor(repo, old, local)):
        raise NonFastForward(
            f"push to {remote_name}/{branch} rejected: the remote has commits you do not have "
            f"(not a fast-forward); run `wvc pull {remote_name} {branch}` first, or push --force"
        )
    known = set()
    for target in state.refs.values():
        if _has_commit(repo, target):
            known.update(ancestors(repo, target))
    new_commits = ancestors(repo, local, stop=known)

    remote_objects = {e.id for name in state.packs for e in remote_index(repo, remote, name)}
    wanted: list[str] = []
    seen = set(remote_objects)
    for cid in new_commits:
        for chunk in sorted(repo.read_tree(repo.read_commit(cid).tree).chunk_ids()):
            while chunk is not None and chunk not in seen:  # the chunk and its delta bases
                seen.add(chunk)
                row = repo.store.row(chunk)
                if row is not None and row.external:
                    break  # a base chunk: the other side reads it from the base, never from us
                wanted.append(chunk)
                chunk = row.base if row else None

    repo.ensure_objects(wanted, progress)  # a lazy clone pushing to another remote
    files: dict[str, Path | bytes] = {}
    with tempfile.TemporaryDirectory(prefix="wvc-push-", dir=repo.wvc_dir) as tmp:
        if wanted:
            writer = PackWriter(Path(tmp))
            rows = [repo.store.row(oid) for oid in wanted]
            progress.start(sum(r.length for r in rows), "packing")
            for row in rows:
                writer.add(row.id, repo.store.reader.read(row.pack, row.offset, row.length), row.raw_size, row.method, row.base)
                progress.advance(row.length)
            progress.close()
            entries = list(writer.entries)
            name, _ = writer.finish()
            files[pack_path(name, "pack")] = Path(tmp) / pack_filename(name)
            files[pack_path(name, "idx")] = canonical_json([e.to_json() for e in entries])
        if ours is not None and theirs is None:
            from .base_model import base_json

            files[BASE_RECORD] = base_json(ours)
        for cid in new_commits:
            commit = repo.read_commit(cid)
            files[commit_path(cid)] = commit.to_bytes()
            files[tree_path(commit.tree)] = repo.read_tree(commit.tree).to_bytes()
        remote.publish(files, {ref: local}, state, f"wvc push {branch} {ids.short(local)}")
    with repo.db.write():
        tracking = f"{REMOTES}{remote_name}/{branch}"
        repo.refs.set(tracking, local, repo.refs.get(tracking), f"push to {remote_name}")
    return PushResult(remote_name, branch, old, local, len(new_commits), len(wanted), remote.bytes_uploaded,
                      old is not None and force and not is_ancestor(repo, old, local), logical)


# -- fetch -----------------------------------------------------------------------------------
@dataclass
class FetchResult:
    remote: str
    refs: dict[str, str]
    commits: int
    objects: int
    downloaded_bytes: int

    def to_json(self):
        return dict(self.__dict__)


def fetch(repo, remote_name: str = "origin", *, progress: Progress = NULL) -> FetchResult:
    remote = open_remote_named(repo, remote_name)
    state = remote.state()
    _check_same_base(repo, remote_name, remote_base(state, remote.url), repo.base())
    commits: dict[str, Commit] = {}
    raw_commits: dict[str, bytes] = {}
    stack = [c for c in state.refs.values() if not _has_commit(repo, c)]
    while stack:
        cid = stack.pop()
        if cid in commits or _has_commit(repo, cid):
            continue
        data = remote.read(commit_path(cid), MAX_SMALL_OBJECT)
        if data is None:
            raise RemoteError(f"remote is missing commit {ids.short(cid)} (a ref or parent points to it)")
        commit = _verified(Commit.from_bytes, data, cid, "commit")
        commits[cid], raw_commits[cid] = commit, data
        stack.extend(commit.parents)
    trees: dict[str, Tree] = {}
    for commit in commits.values():
        if commit.tree in trees or repo.db.one("SELECT 1 FROM trees WHERE id = ?", (commit.tree,)):
            continue
        data = remote.read(tree_path(commit.tree), MAX_SMALL_OBJECT)
        if data is None:
            raise RemoteError(f"remote is missing tree {ids.short(commit.tree)}")
        trees[commit.tree] = _verified(Tree.from_bytes, data, commit.tree, "tree")

    from .partial import lazy_remote

    # a lazy clone takes commits and trees only; chunks come on first use (ops/partial.py)
    needed = set() if lazy_remote(repo) else {c for t in trees.values() for c in t.chunk_ids() if not repo.store.has(c)}
    packs_to_get = []
    for name in state.packs:
        if needed and repo.db.one("SELECT 1 FROM packs WHERE name = ?", (name,)) is None:
            entries = remote_index(repo, remote, name)
            if needed & {e.id for e in entries}:
                packs_to_get.append(name)
                needed -= {e.id for e in entries}
    if needed:
        raise RemoteError(f"remote is missing {len(needed)} objects, e.g. {ids.short(next(iter(needed)))}")

    staged = []
    tmp = Path(tempfile.mkdtemp(prefix="wvc-fetch-", dir=repo.wvc_dir))
    try:
        downloaded = []
        sizes = {name: sum(e.length for e in remote_index(repo, remote, name)) for name in packs_to_get}
        progress.start(sum(sizes.values()), "downloading")
        for name in packs_to_get:
            dest = tmp / pack_filename(name)
            remote.download(pack_path(name), dest, MAX_PACK_BYTES)
            downloaded.append((name, dest))
            progress.advance(sizes[name])
        progress.close()
        staged = [(name, dest, rows) for (name, dest), rows in zip(downloaded, verify_packs(repo, downloaded))]
        for name, dest, _ in staged:
            os.replace(dest, repo.store.packs_dir / pack_filename(name))
        if staged:
            fsync_dir(repo.store.packs_dir)
        with repo.db.write():
            for name, dest, rows in staged:
                repo.store.insert_rows((name, (repo.store.packs_dir / pack_filename(name)).stat().st_size), rows)
            for tid, tree in trees.items():
                repo.db.conn.execute("INSERT OR IGNORE INTO trees VALUES (?, ?)", (tid, tree.to_bytes()))
            for cid, commit in commits.items():
                repo.db.conn.execute("INSERT OR IGNORE INTO commits VALUES (?, ?, ?, ?, ?)",
                                     (cid, commit.tree, commit.timestamp, None, raw_commits[cid]))
                repo.db.conn.executemany("INSERT OR IGNORE INTO commit_parents VALUES (?, ?, ?)",
                                         [(cid, i, p) for i, p in enumerate(commit.parents)])
            tracked = {}
            for ref, target in state.refs.items():
                if ref.startswith(HEADS):
                    local_ref = f"{REMOTES}{remote_name}/{ref[len(HEADS):]}"
                    tracked[ref[len(HEADS):]] = target
                    if repo.refs.get(local_ref) != target:
                        repo.refs.set(local_ref, target, repo.refs.get(local_ref), f"fetch from {remote_name}")
            for branch in repo.refs.list(f"{REMOTES}{remote_name}/"):
                if branch not in tracked:  # deleted on the remote
                    repo.refs.delete(f"{REMOTES}{remote_name}/{branch}", f"fetch from {remote_name}: pruned")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return FetchResult(remote_name, tracked, len(commits), sum(len(r) for _, _, r in staged), remote.bytes_downloaded)


def _verified(parse, data: bytes, expected: str, what: str):
    try:
        return parse(data, expected_id=expected)
    except WvcError as exc:
        raise CorruptObject(f"remote {what} {ids.short(expected)} is corrupt: {exc}") from None


def verify_packs(repo, packs: list[tuple[str, Path]]) -> list[list[ObjectRow]]:
    """Check each pack's checksum, then decode every object against its id.

    A delta's base may be in the same pack, in another pack of this fetch, or local.
    """
    by_id: dict[str, tuple[str, Path, PackEntry]] = {}
    per_pack = []
    for name, path in packs:
        try:
            checksum, entries = read_pack_index(path)
        except WvcError as exc:
            raise CorruptObject(f"remote pack {name[:12]} is corrupt: {exc}") from None
        if checksum != name:
            raise CorruptObject(f"remote pack {name[:12]} does not match its name")
        per_pack.append((name, entries))
        for e in entries:
            by_id.setdefault(e.id, (name, path, e))
    is_base = {e.base for _, entries in per_pack for e in entries if e.base}
    decoded: dict[str, tuple[bytes, int]] = {}

    def decode(oid: str, guard: int = 0) -> tuple[bytes, int]:
        if oid in decoded:
            return decoded[oid]
        if guard > 10_000:
            raise CorruptObject("remote packs hold a cyclic delta chain")
        found = by_id.get(oid)
        if found is None:  # a base we already have locally
            row = repo.store.row(oid)
            if row is None:
                raise CorruptObject(f"remote object needs base {ids.short(oid)} that neither side has")
            return repo.store.get(oid), row.depth
        name, path, entry = found
        base_raw, base_depth = decode(entry.base, guard + 1) if entry.base else (None, -1)
        with open(path, "rb") as fh:
            fh.seek(entry.offset)
            payload = fh.read(entry.length)
        raw = decode_verified(oid, payload, entry.raw_size, base_raw, f"remote pack {name[:12]}")
        if oid in is_base:  # keep only what later objects decode against
            decoded[oid] = (raw, base_depth + 1)
        return raw, base_depth + 1

    out = []
    for name, entries in per_pack:
        rows = []
        for e in entries:
            _, depth = decode(e.id)
            rows.append(ObjectRow(e.id, name, e.offset, e.length, e.raw_size, e.method, e.base, depth))
        out.append(rows)
    return out


# -- pull and clone ----------------------------------------------------------------------------
def pull(repo, remote_name: str = "origin", branch: str | None = None, *, rebase: bool = False,
         progress: Progress = NULL) -> dict:
    from .checkout import checkout

    fetched = fetch(repo, remote_name, progress=progress)
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise WvcError("HEAD is detached: name the branch to pull")
    upstream = repo.refs.get(f"{REMOTES}{remote_name}/{branch}")
    if upstream is None:
        raise RevisionNotFound(f"remote {remote_name} has no branch {branch!r}")
    local = repo.refs.get(HEADS + branch)
    result = {"remote": remote_name, "branch": branch, "old": local, "new": upstream,
              "downloaded_bytes": fetched.downloaded_bytes, "fast_forward": True}
    if local == upstream or (local is not None and is_ancestor(repo, upstream, local)):
        result["new"] = local
        return result  # up to date, or ahead
    if local is not None and not is_ancestor(repo, local, upstream):
        if not rebase:
            raise NonFastForward(
                f"branches diverged: local {branch} ({ids.short(local)}) and {remote_name}/{branch} "
                f"({ids.short(upstream)}) each have commits the other lacks; `wvc pull --rebase` replays "
                f"your commits on top of {remote_name}/{branch}"
            )
        new_tip = _replay(repo, local, upstream)
        result.update(new=new_tip, fast_forward=False, rebased=True)
        with repo.db.write():  # the new tip has the local tip's tree: the working tree stays as is
            repo.refs.set(HEADS + branch, new_tip, local, f"pull --rebase onto {remote_name}/{branch}")
        return result
    if repo.refs.head_branch() == branch:
        checkout(repo, upstream, progress=progress)  # refuses to overwrite local work
        with repo.db.write():
            repo.refs.set(HEADS + branch, upstream, local, f"pull: fast-forward from {remote_name}")
            repo.refs.set_head("ref: " + HEADS + branch, f"pull: back on {branch}")
    else:
        with repo.db.write():
            repo.refs.set(HEADS + branch, upstream, local, f"pull: fast-forward from {remote_name}")
    return result


def _replay(repo, local: str, upstream: str) -> str:
    """Re-create the local-only commits (oldest first) on top of ``upstream``.

    A commit is a full snapshot, so replaying one keeps its tree, message, author and
    metadata and only changes its parent: no chunk is re-encoded, nothing is merged.
    """
    base = set(ancestors(repo, upstream))
    mine = ancestors(repo, local, stop=base)
    order = sorted(mine, key=lambda c: repo.db.one("SELECT rowid FROM commits WHERE id = ?", (c,)))
    parent = upstream
    with repo.db.write():
        for cid in order:
            old = repo.read_commit(cid)
            new = Commit(old.tree, (parent,), old.author, old.timestamp, old.message, old.metadata)
            repo.db.conn.execute("INSERT OR IGNORE INTO commits VALUES (?, ?, ?, ?, ?)",
                                 (new.id, new.tree, new.timestamp, 0, new.to_bytes()))
            repo.db.conn.execute("INSERT OR IGNORE INTO commit_parents VALUES (?, ?, ?)", (new.id, 0, parent))
            parent = new.id
    return parent


def _attach_remote_base(repo, remote, base, progress: Progress) -> None:
    """Find or download the base a remote records and check it gives the recorded tree."""
    from .base_model import attach, base_commit

    if base_commit(base.url, base.tree).id != base.commit:
        raise RemoteError(f"remote base record is inconsistent: commit {ids.short(base.commit)} is not the root "
                          f"commit of {base.url}")
    data = remote.read(tree_path(base.tree), MAX_SMALL_OBJECT)
    if data is None:
        raise RemoteError(f"remote is missing the base's tree {ids.short(base.tree)}")
    tree = _verified(Tree.from_bytes, data, base.tree, "tree")
    attach(repo, base.url, expected=base, expected_tree=tree, set_branch=False, progress=progress)


def clone(url: str, directory=None, *, branch: str | None = None, lazy: bool = False, progress: Progress = NULL):
    """``lazy``: commits and trees now, chunks on first use (only the checked-out version's)."""
    from ..repo import Repo

    remote = open_remote(url)
    if directory is None:
        directory = url.rstrip("/").rpartition("/")[2].removesuffix(".wvc") or "model"
    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        raise WvcError(f"destination {target} exists and is not empty")
    state = remote.state()  # fail before creating anything if the remote is unusable
    heads = [r[len(HEADS):] for r in state.refs if r.startswith(HEADS)]
    if not heads:
        raise RemoteError(f"{url} has no branches")
    branch = branch or ("main" if "main" in heads else sorted(heads)[0])
    if branch not in heads:
        raise RevisionNotFound(f"{url} has no branch {branch!r}")
    base = remote_base(state, url)
    created = not target.exists()
    try:
        repo = Repo.init(target, branch=branch)
        if base is not None:
            _attach_remote_base(repo, remote, base, progress)
        remote_add(repo, "origin", url)
        if lazy:
            with repo.db.write():
                repo.db.set_config("lazy.remote", "origin")
        fetched = fetch(repo, "origin", progress=progress)
        pull(repo, "origin", branch, progress=progress)
    except BaseException:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        else:
            shutil.rmtree(target / ".wvc", ignore_errors=True)
        raise
    head = repo.refs.head_commit()
    return repo, {"path": str(repo.root), "branch": branch, "commit": head, "lazy": lazy,
                  "downloaded_bytes": fetched.downloaded_bytes + repo.lazy_downloaded,
                  "logical_bytes": repo.read_tree(repo.read_commit(head).tree).logical_bytes}
