"""Checkout: make the working tree (or another directory) hold a commit's files.

Refuses to overwrite uncommitted work: a tracked file modified since HEAD that the target
changes or removes, or an untracked file in the way of a target file. Local changes to
files the target leaves alone are carried over, as in git. Files are replaced one by one
atomically; HEAD moves only after every file is in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UncommittedChanges, WvcError
from ..fsutil import resolve_inside
from ..progress import NULL, Progress
from ..store.refs import HEADS
from ..worktree import StatCache, scan
from .commit import MERGE_HEAD, MERGE_RECIPE
from .materialize import write_file


@dataclass(frozen=True)
class CheckoutResult:
    commit: str
    branch: str | None
    written: int
    removed: int
    output: str | None

    def to_json(self):
        return {"commit": self.commit, "branch": self.branch, "written": self.written, "removed": self.removed, "output": self.output}


def checkout(repo, rev: str, *, force: bool = False, output=None, progress: Progress = NULL) -> CheckoutResult:
    commit_id = repo.resolve(rev)
    branch = rev if repo.refs.get(HEADS + rev) is not None else None
    if rev == "HEAD":  # as in git: checking out HEAD restores files and stays on the branch
        branch = repo.refs.head_branch()
    target = repo.read_tree(repo.read_commit(commit_id).tree)
    if output is not None:
        return _to_directory(repo, commit_id, target, Path(output), force, progress)

    head = repo.refs.head_commit()
    current_tree = repo.read_tree(repo.read_commit(head).tree) if head else target
    # entries by content id (.hash of format 2): comparable with working files' content ids
    current = {p: f.with_content_id() for p, f in current_tree.by_path().items()} if head else {}
    target_entries = target.by_path()
    wanted = {p: f.with_content_id() for p, f in target_entries.items()}
    present = scan(repo.root).files
    cache = StatCache(repo.db, repo.root)
    hashes = {p: cache.hash(p, target.chunk_bytes) for p in present}
    mine_hashes = hashes  # against HEAD's entries: the same unless HEAD was chunked otherwise
    if current_tree.chunk_bytes != target.chunk_bytes:
        mine_hashes = {p: cache.hash(p, current_tree.chunk_bytes) for p in present}

    conflicts = []
    for path, digest in hashes.items():
        mine = current.get(path)
        theirs = wanted.get(path)
        if mine is None:  # untracked: only a problem if the target puts a different file there
            if theirs is not None and theirs.hash != digest:
                conflicts.append(path)
        elif (mine_hashes[path] != mine.hash and (theirs is None or theirs.hash != mine.hash)
              and (theirs is None or theirs.hash != digest)):
            conflicts.append(path)
    if conflicts and not force:
        shown = ", ".join(conflicts[:5]) + (" ..." if len(conflicts) > 5 else "")
        raise UncommittedChanges(
            f"checkout would overwrite uncommitted changes in {shown}; commit them or use --force"
        )

    def carried(path, entry):  # locally modified, and the target does not touch it
        return not force and path in hashes and path in current and current[path].hash == entry.hash

    to_write = [e for p, e in wanted.items() if hashes.get(p) != e.hash and not carried(p, e)]
    to_remove = [p for p in current if p not in wanted and p in hashes and (force or mine_hashes[p] == current[p].hash)]
    repo.store.ensure_local((c for e in to_write for c in e.chunk_ids()), progress)  # lazy clones
    progress.start(sum(e.size for e in to_write), "checkout")
    for entry in to_write:
        dest = resolve_inside(repo.root, entry.path)
        if dest.is_dir():
            raise WvcError(f"cannot check out {entry.path}: a directory is in the way")
        written = write_file(repo.store, target_entries[entry.path], dest, progress)  # as recorded
        cache.remember(entry.path, written, target.chunk_bytes, entry.hash)
    for path in to_remove:
        dest = resolve_inside(repo.root, path)
        dest.unlink(missing_ok=True)
        _prune_empty_dirs(repo.root, dest.parent)
    progress.close()

    with repo.db.write():
        if branch is not None:
            repo.refs.set_head("ref: " + HEADS + branch, f"checkout: moving to {branch}")
        else:
            repo.refs.set_head(commit_id, f"checkout: moving to {commit_id}")
        cache.forget(to_remove)
        cache.flush(in_transaction=True)
        repo.db.delete_config(MERGE_HEAD)  # a merge written with --no-commit ends with any checkout
        repo.db.delete_config(MERGE_RECIPE)
    return CheckoutResult(commit_id, branch, len(to_write), len(to_remove), None)


def _to_directory(repo, commit_id, tree, out: Path, force: bool, progress: Progress) -> CheckoutResult:
    if out.exists() and any(out.iterdir()) and not force:
        raise WvcError(f"output directory {out} is not empty (use --force to write into it)")
    out.mkdir(parents=True, exist_ok=True)
    repo.store.ensure_local(tree.chunk_ids(), progress)
    progress.start(tree.logical_bytes, "checkout")
    for entry in tree.files:
        write_file(repo.store, entry, resolve_inside(out, entry.path), progress)
    progress.close()
    return CheckoutResult(commit_id, None, len(tree.files), 0, os.fspath(out))


def _prune_empty_dirs(root: Path, directory: Path) -> None:
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
