"""The working tree refreshed to a commit it was not the source of.

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
from ..fsutil import EarlyWriteback, fsync_dir, new_temp, resolve_inside
from ..model.versions import Tree
from ..progress import NULL, Progress
from .scan import StatCache
from .materialize import tensors_verified, write_file

log = logging.getLogger(__name__)


class SourceCopies:
    """The files a commit from another directory reads, written as it reads them (the
    TreeBuilder's ``tee``) into claimed temp files in the working tree ``root``: the very
    bytes whose hashes the commit records, so the refresh renames them into place with no
    copy and no check to make (a copy of the source after the commit would need a check, as
    the source may have changed since). A file without one (a `gc --grace 0` removed it,
    or its folder is on another file system) is decoded from the store."""

    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, tuple[str, str]] = {}  # path -> (temp file, the content id it holds)

    def __call__(self, path: str, executable: bool) -> "_Sink":
        return _Sink(self, path, executable)

    def take(self, path: str, entry) -> str | None:
        """The temp file holding ``entry``'s bytes, fsynced, now the caller's to rename; or None."""
        tmp, held = self.files.pop(path, (None, None))
        if tmp is None:
            return None
        try:
            if held != entry.content_id:
                os.unlink(tmp)
                return None
            fd = os.open(tmp, os.O_RDONLY)
        except FileNotFoundError:  # (a `gc --grace 0` meanwhile: its lock went when it was written)
            return None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def __enter__(self) -> "SourceCopies":
        return self

    def __exit__(self, *_) -> None:
        """The temp files nothing took (the commit failed, or the follow left the file)."""
        for tmp, _ in self.files.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self.files.clear()


class _Sink:
    """One file's temp copy as the commit reads it (SourceCopies)."""

    def __init__(self, copies: SourceCopies, path: str, executable: bool):
        self.copies, self.path = copies, path
        fd, self.tmp = new_temp(copies.root, executable)
        self.fh = os.fdopen(fd, "wb")
        self.out, self.size = EarlyWriteback(self.fh), 0

    def write(self, data) -> None:
        self.size += self.out.write(data)

    def finish(self, entry) -> None:
        self.fh.close()  # (the lock goes with it; a temp file is gc's only after its grace period)
        if self.size != entry.size:  # (by construction it is: a guard, not a check of the bytes)
            os.unlink(self.tmp)
            return
        self.copies.files[self.path] = (self.tmp, entry.content_id)

    def abort(self) -> None:
        self.fh.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


@dataclass(frozen=True)
class StateDictSource:
    """A state dict a commit recorded as the file at ``path``."""
    path: str
    tensors: Mapping


def refresh_worktree(repo, parent_tree: Tree | None, new_tree: Tree, progress: Progress = NULL,
                  source: SourceCopies | StateDictSource | None = None) -> None:
    """``source``: what the commit read (a directory's files as it read them, or a state
    dict), from which a file is taken (or written and checked) rather than decoded from the
    store."""
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
    """``entry`` put at ``dest`` from what the commit read; None if it cannot be."""
    if isinstance(source, SourceCopies):
        tmp = source.take(path, entry)
        if tmp is not None:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, dest)
            except OSError:  # (e.g. a folder of the working tree on another file system)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            else:
                fsync_dir(dest.parent)
                progress.advance(entry.size)
                return os.stat(dest)
        return None
    if isinstance(source, StateDictSource) and path == source.path and entry.kind == "safetensors":
        return tensors_verified(repo.store.get(entry.header), source.tensors, dest, entry, chunk_bytes, progress)
    return None
