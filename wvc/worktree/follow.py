"""The working tree follows a commit it was not the source of.

A state dict, a checkpoint directory or a DCP save committed onto HEAD's branch (or a
detached HEAD) is HEAD's new version; if the working tree kept the parent's files they
would read as local changes (a DCP save's files as deleted ones), and the next plain
``wvc commit`` would record them, reverting the save. So each file the commit changed,
added or removed is brought to the new version where the working copy is still the
parent's (or absent); a working copy with edits of its own is left as it is (status shows
it), as git carries local changes over a checkout. Another process switching the working
tree right now is not waited for (a trainer's commit must not stall behind a checkout).
"""

from __future__ import annotations

import logging
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import LockedError
from ..fsutil import resolve_inside
from ..model.versions import Tree
from ..progress import NULL, Progress
from .scan import StatCache
from .materialize import copy_verified, tensors_verified, write_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateDictSource:
    """A state dict a commit recorded as the file at ``path``."""
    path: str
    tensors: Mapping


def follow_commit(repo, parent_tree: Tree | None, new_tree: Tree, progress: Progress = NULL,
                  source: Path | StateDictSource | None = None) -> None:
    """``source``: what the commit read (a directory, or a state dict), from which a file is
    written (and checked) rather than decoded from the store, where it still holds the
    committed bytes."""
    before = parent_tree.by_path() if parent_tree is not None else {}
    after = new_tree.by_path()
    changed = [p for p in sorted(set(before) | set(after))
               if before.get(p) is None or after.get(p) is None
               or before[p].with_content_id().hash != after[p].with_content_id().hash]
    if not changed:
        return
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(repo.worktree_lock("commit", timeout=0))
        except LockedError as exc:
            log.debug("the working tree does not follow the new commit: %s", exc)
            return
        cache = StatCache(repo.db, repo.root)
        removed = []
        for path in changed:
            dest = resolve_inside(repo.root, path, replacing_link=True)
            old = before.get(path)
            if dest.is_dir() and not dest.is_symlink():
                continue  # a directory of the user's in the way: theirs
            if os.path.lexists(dest):
                if old is None or cache.hash(path, parent_tree.chunk_bytes) != old.with_content_id().hash:
                    continue  # untracked, or edited since the parent: the user's
            new = after.get(path)
            if new is None:
                if os.path.lexists(dest):
                    dest.unlink()
                    removed.append(path)
                continue
            written = _from_source(repo, source, path, new, dest, new_tree.chunk_bytes, progress)
            if written is None:
                written = write_file(repo.store, new, dest, progress)
            cache.remember(path, written, new_tree.chunk_bytes, new.with_content_id().hash)
        with repo.db.write():
            cache.forget(removed)
            cache.flush(in_transaction=True)


def _from_source(repo, source, path: str, entry, dest: Path, chunk_bytes: int, progress: Progress):
    """``entry`` written to ``dest`` from what the commit read, checked; None if it cannot be."""
    if isinstance(source, Path):
        return copy_verified(source / path, dest, entry, chunk_bytes, progress)
    if isinstance(source, StateDictSource) and path == source.path and entry.kind == "safetensors":
        return tensors_verified(repo.store.get(entry.header), source.tensors, dest, entry, chunk_bytes, progress)
    return None
