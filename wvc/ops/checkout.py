"""Checkout: make the working tree (or another directory) hold a commit's files.

Refuses to overwrite uncommitted work: a tracked file modified since HEAD that the target
changes or removes, or an untracked file in the way of a target file or directory. Local
changes to files the target leaves alone are carried over, as in git. Plans first, then
removes, then writes (each file replaced atomically); HEAD moves only after every file is
in place. Holds the working-tree lock throughout.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import ids
from ..errors import MissingEntry, PathInTheWay, UncommittedChanges
from ..fsutil import resolve_inside, selected
from ..model.versions import Tree
from ..progress import NULL, Progress
from ..store.config_keys import MERGE_HEAD, MERGE_RECIPE
from ..store.refs import HEADS
from ..worktree.scan import StatCache, scan
from ..worktree.materialize import write_file


@dataclass(frozen=True)
class CheckoutResult:
    commit: str
    branch: str | None
    written: int
    removed: int
    output: str | None
    restored: list[str] | None = None  # checkout REV -- PATH: the files restored

    def to_json(self):
        return {"commit": self.commit, "branch": self.branch, "written": self.written, "removed": self.removed,
                "output": self.output, "restored": self.restored}


def checkout(repo, rev: str, *, force: bool = False, output=None, paths=None,
             progress: Progress = NULL) -> CheckoutResult:
    """Switch the working tree and HEAD to ``rev``; or write ``rev`` into ``output``; or, with
    ``paths``, restore those files (or directories) from ``rev`` without moving HEAD."""
    commit_id = repo.resolve(rev)
    branch = rev if repo.refs.get(HEADS + rev) is not None else None
    if rev == "HEAD":  # as in git: checking out HEAD restores files and stays on the branch
        branch = repo.refs.head_branch()
    target = repo.tree_of(commit_id)  # (a pruned version is refused, naming the nearest kept ones)
    if output is not None:
        return _to_directory(repo, commit_id, target, Path(output), force, progress)
    with repo.worktree_lock("checkout"):
        if paths:
            return _restore_paths(repo, commit_id, target, paths, progress)
        head = repo.refs.head_commit()
        current_tree = repo.read_tree(repo.read_commit(head).tree) if head else None
        written, removed = switch_worktree(repo, current_tree, target, force=force, progress=progress)
        with repo.db.write():
            if branch is not None:
                repo.refs.set_head("ref: " + HEADS + branch, f"checkout: moving to {branch}")
            else:
                repo.refs.set_head(commit_id, f"checkout: moving to {commit_id}")
            repo.db.delete_config(MERGE_HEAD)  # a merge written with --no-commit ends with any checkout
            repo.db.delete_config(MERGE_RECIPE)
    return CheckoutResult(commit_id, branch, written, removed, None)


def switch_worktree(repo, current_tree: Tree | None, target: Tree, *, force: bool = False,
                    progress: Progress = NULL) -> tuple[int, int]:
    """Make the working tree, which holds ``current_tree`` plus local work, hold ``target``.

    Plans everything first: uncommitted work it would overwrite or remove, and untracked
    files in the way of a file or a directory of the target, are refused before anything
    is touched (``force`` overwrites them). Then removes what goes (so a file can become a
    directory and back), then writes what changes. A failure part-way leaves HEAD where it
    was; rerunning the same switch finishes it (files already written match the target and
    are not work to protect). The caller holds the working-tree lock and moves HEAD.
    """
    # entries by content id (.hash of format 2): comparable with working files' content ids
    current = {p: f.with_content_id() for p, f in current_tree.by_path().items()} if current_tree else {}
    target_entries = target.by_path()
    wanted = {p: f.with_content_id() for p, f in target_entries.items()}
    present = scan(repo.root).files
    cache = StatCache(repo.db, repo.root)
    hashes = {p: cache.hash(p, target.chunk_bytes) for p in present}
    mine_hashes = hashes  # against HEAD's entries: the same unless HEAD was chunked otherwise
    if current_tree is not None and current_tree.chunk_bytes != target.chunk_bytes:
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

    def carried(path, entry):  # locally modified, and the target does not touch it
        return not force and path in hashes and path in current and current[path].hash == entry.hash

    to_write = [e for p, e in wanted.items() if hashes.get(p) != e.hash and not carried(p, e)]
    to_remove = [p for p in current if p not in wanted and p in hashes and (force or mine_hashes[p] == current[p].hash)]
    in_the_way = _in_the_way(repo.root, to_write, set(present) - set(to_remove), set(to_remove))
    conflicts += [f"{p} (in the way of {what})" for p, what in in_the_way]
    if conflicts and not force:
        shown = ", ".join(conflicts[:5]) + (" ..." if len(conflicts) > 5 else "")
        raise UncommittedChanges(
            f"checkout would overwrite uncommitted changes in {shown}; commit them or use --force"
        )
    repo.store.ensure_local((c for e in to_write for c in e.chunk_ids()), progress)  # lazy clones

    for path in to_remove:
        dest = resolve_inside(repo.root, path, replacing_link=True)
        dest.unlink(missing_ok=True)
        _prune_empty_dirs(repo.root, dest.parent)
    for path, _ in in_the_way:  # only with force: untracked work the user chose to lose
        dest = resolve_inside(repo.root, path.rstrip("/"), replacing_link=True)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        else:
            dest.unlink(missing_ok=True)
    progress.start(sum(e.size for e in to_write), "checkout")
    for entry in to_write:
        dest = resolve_inside(repo.root, entry.path, replacing_link=True)
        if dest.is_dir() and not dest.is_symlink():  # emptied above unless it held ignored files
            _prune_empty_dirs(repo.root, dest)
            if dest.is_dir():
                raise PathInTheWay(f"cannot check out {entry.path}: a directory with ignored files is in the way")
        written = write_file(repo.store, target_entries[entry.path], dest, progress)  # as recorded
        cache.remember(entry.path, written, target.chunk_bytes, entry.hash)
    progress.close()
    with repo.db.write():
        cache.forget(to_remove)
        cache.flush(in_transaction=True)
    return len(to_write), len(to_remove)


def _in_the_way(root: Path, to_write, staying: set[str], leaving: set[str]) -> list[tuple[str, str]]:
    """Working files a target file or directory would collide with and that are not going
    anyway: a file where the target needs a directory (``a`` for ``a/b``), or a directory
    holding files that stay where the target needs a file (``a/`` for ``a``)."""
    found = {}
    for entry in to_write:
        parts = entry.path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in staying:
                found[prefix] = f"directory {prefix}/"
        dest = root.joinpath(*parts)
        if dest.is_dir() and not dest.is_symlink():
            inside = [p for p in staying if p.startswith(entry.path + "/")]
            if inside:
                found[entry.path + "/"] = f"file {entry.path} ({len(inside)} files inside)"
    return sorted(found.items())


def _restore_paths(repo, commit_id: str, tree: Tree, paths, progress: Progress) -> CheckoutResult:
    """``checkout REV -- PATH...``: those files as REV has them, HEAD unchanged (local changes
    to them are overwritten, as in git: naming the path is the consent)."""
    entries = []
    for raw in paths:
        match = [f for f in tree.files if selected(f.path, [raw])]
        if not match:
            raise MissingEntry(f"{raw!r} did not match any file in {ids.short(commit_id)}")
        entries += match
    entries = list({e.path: e for e in entries}.values())
    repo.store.ensure_local((c for e in entries for c in e.chunk_ids()), progress)
    cache = StatCache(repo.db, repo.root)
    progress.start(sum(e.size for e in entries), "checkout")
    for entry in entries:
        dest = resolve_inside(repo.root, entry.path, replacing_link=True)
        if dest.is_dir() and not dest.is_symlink():
            raise PathInTheWay(f"cannot restore {entry.path}: a directory is in the way")
        written = write_file(repo.store, entry, dest, progress)
        cache.remember(entry.path, written, tree.chunk_bytes, entry.with_content_id().hash)
    progress.close()
    with repo.db.write():
        cache.flush(in_transaction=True)
    return CheckoutResult(commit_id, None, len(entries), 0, None, [e.path for e in entries])


def _to_directory(repo, commit_id, tree, out: Path, force: bool, progress: Progress) -> CheckoutResult:
    if out.exists() and any(out.iterdir()) and not force:
        raise PathInTheWay(f"output directory {out} is not empty (use --force to write into it)")
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
