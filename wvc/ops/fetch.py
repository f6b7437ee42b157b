"""Fetch: refs -> missing commits (verified against their ids) -> missing trees (verified)
-> the packs holding missing chunks, downloaded and checked (pack checksum, every object
decoded and hashed, streaming: remotes/downloads.py) -> one local transaction records it all
and moves the remote-tracking refs ``refs/remotes/<remote>/<branch>``. Nothing unverified
is ever recorded."""

from __future__ import annotations

import os
import time
import shutil
from dataclasses import dataclass, field

from .. import ids
from ..errors import RemoteError
from ..fsutil import fsync_dir, make_work_dir, sweep_work_dirs
from ..model.versions import Commit, Tree
from ..progress import NULL, Progress
from ..remotes import lazy_remote_name
from ..remotes.downloads import verify_packs
from ..store.graph import UNKNOWN
from ..store.packs import pack_filename
from ..store.refs import HEADS, TAGS
from ..basemodel.remote import check_same_base, remote_base
from .remote_config import REMOTES, open_remote_repository

@dataclass
class FetchResult:
    remote: str
    refs: dict[str, str]
    commits: int
    objects: int
    downloaded_bytes: int
    tags: dict[str, str] = field(default_factory=dict)  # tags the remote has that are now local too

    def to_json(self):
        return dict(self.__dict__)


def fetch(repo, remote_name: str = "origin", *, progress: Progress = NULL, remote=None) -> FetchResult:
    """``remote``: the RemoteRepository of this operation when the caller listed it already
    (a clone: one listing for the base, the fetch and the pull)."""
    remote = remote or open_remote_repository(repo, remote_name)
    check_same_base(remote_name, remote_base(remote.base_record, remote.url), repo.base())
    contents = remote.contents
    commits, raw_commits = _missing_commits(repo, remote)
    trees: dict[str, Tree] = {}
    for commit in commits.values():
        if commit.tree not in trees and not repo.graph.has_tree(commit.tree):
            trees[commit.tree] = remote.tree(commit.tree)

    # a lazy clone takes commits and trees only; chunks come on first use (remotes/lazy.py)
    lazy_from = lazy_remote_name(repo.db)
    if lazy_from == remote_name and repo.store.supply is not None:
        repo.store.supply.use(remote)  # later chunk reads in this process go by this listing
    lazy = lazy_from is not None
    # a version `prune --remote` dropped comes as its commit and tree, marked pruned here too
    weighted = {c.tree for cid, c in commits.items() if cid not in remote.pruned}
    pruned = [cid for cid, c in commits.items() if cid in remote.pruned and c.tree not in weighted]
    needed = set() if lazy else {c for tid, t in trees.items() if tid in weighted for c in t.chunk_ids()
                                 if not repo.store.has(c)}
    packs_to_get, lengths, sizes = [], {}, {}
    for seg in contents.segments:
        if needed and seg.pack and seg.pack not in sizes and not repo.store.has_pack(seg.pack):
            ids_here = {e.id for e in seg.entries}
            if needed & ids_here:
                packs_to_get.append(seg.pack)
                sizes[seg.pack] = seg.pack_bytes
                needed -= ids_here
                lengths.update((e.id, e.length) for e in seg.entries)
    if needed:
        raise RemoteError(f"remote is missing {len(needed)} objects, e.g. {ids.short(next(iter(needed)))}")

    staged = []
    sweep_work_dirs(repo.wvc_dir)  # a killed fetch's downloads
    tmp = make_work_dir(repo.wvc_dir, "fetch")
    try:
        downloaded = []
        progress.start(sum(sizes.values()), "downloading")
        for name in packs_to_get:
            dest = tmp / pack_filename(name)
            remote.download_pack(name, dest)
            downloaded.append((name, dest))
            progress.advance(sizes[name])
        progress.close()
        staged = [(name, dest, rows) for (name, dest), rows in zip(downloaded, verify_packs(repo.store, downloaded))]
        for name, dest, _ in staged:
            os.replace(dest, repo.store.packs_dir / pack_filename(name))
        if staged:
            fsync_dir(repo.store.packs_dir)
        with repo.db.write():
            for name, dest, rows in staged:
                repo.store.insert_rows((name, (repo.store.packs_dir / pack_filename(name)).stat().st_size), rows)
            for cid in reversed(commits):  # (oldest first: a parent's tree is there for its child's delta)
                commit = commits[cid]
                if commit.tree in trees:
                    first = commit.parents[0] if commit.parents else None
                    base = commits[first].tree if first in commits else repo.graph.tree_of(first) if first else None
                    repo.graph.add_tree(trees[commit.tree], base)
            for cid, commit in commits.items():
                repo.graph.add_commit(commit, _introduced_bytes(repo, commit, commits, trees, lengths),
                                      raw_commits[cid])
            repo.graph.mark_pruned(pruned, int(time.time()))
            tracked = _move_tracking_refs(repo, remote_name, remote.refs)
            new_tags = _take_tags(repo, remote_name, remote.refs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return FetchResult(remote_name, tracked, len(commits), sum(len(r) for _, _, r in staged), remote.downloaded_bytes,
                       new_tags)


def _missing_commits(repo, remote):
    """The commits the remote's refs reach that this repository lacks, each verified, and
    their canonical bytes."""
    commits: dict[str, Commit] = {}
    raw: dict[str, bytes] = {}
    stack = [c for c in remote.refs.values() if not repo.graph.has_commit(c)]
    while stack:
        cid = stack.pop()
        if cid in commits or repo.graph.has_commit(cid):
            continue
        commits[cid], raw[cid] = remote.verified_commit(
            cid, f"remote is missing commit {ids.short(cid)} (a ref or parent points to it)")
        stack.extend(commits[cid].parents)
    return commits, raw


def _introduced_bytes(repo, commit: Commit, commits: dict[str, Commit], trees: dict[str, Tree],
                      lengths: dict[str, int]) -> int | None:
    """What the commit's new chunks (in its tree, in none of its parents') take in the packs
    this fetch downloaded: the figure a local commit records. UNKNOWN when a chunk's size is
    not known here (a lazy clone fetches no chunks)."""
    def tree_of(tree_id: str) -> Tree:
        return trees.get(tree_id) or repo.read_tree(tree_id)

    inherited: set[str] = set()
    for p in commit.parents:
        parent = commits.get(p) or (repo.read_commit(p) if repo.graph.has_commit(p) else None)
        if parent is not None:
            inherited |= tree_of(parent.tree).chunk_ids()
    total = 0
    for c in tree_of(commit.tree).chunk_ids() - inherited:
        if c in lengths:
            total += lengths[c]
        elif not repo.store.has(c):
            return UNKNOWN
    return total


def _take_tags(repo, remote_name: str, remote_refs: dict[str, str]) -> dict[str, str]:
    """The remote's tags become local tags (as git fetches tags into the history it brings);
    a local tag of the same name that points elsewhere is kept: a tag never moves silently."""
    taken = {}
    for ref, target in remote_refs.items():
        if ref.startswith(TAGS) and repo.refs.get(ref) is None and repo.graph.has_commit(target):
            repo.refs.set(ref, target, None, f"fetch from {remote_name}: tag")
            taken[ref[len(TAGS):]] = target
    return taken


def _move_tracking_refs(repo, remote_name: str, remote_refs: dict[str, str]) -> dict[str, str]:
    tracked = {}
    for ref, target in remote_refs.items():
        if ref.startswith(HEADS):
            local_ref = f"{REMOTES}{remote_name}/{ref[len(HEADS):]}"
            tracked[ref[len(HEADS):]] = target
            if repo.refs.get(local_ref) != target:
                repo.refs.set(local_ref, target, repo.refs.get(local_ref), f"fetch from {remote_name}")
    for branch in repo.refs.list(f"{REMOTES}{remote_name}/"):
        if branch not in tracked:  # deleted on the remote
            repo.refs.delete(f"{REMOTES}{remote_name}/{branch}", f"fetch from {remote_name}: pruned")
    return tracked
