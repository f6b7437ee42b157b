"""Commit: snapshot, make the pack durable, then record everything in one transaction.

Write order (docs/design.md, "Write ordering"): pack bytes fsynced and renamed first; then
object rows, tree, commit and the branch move commit together or not at all. The branch
moves by compare-and-swap against the parent we snapshotted against, so a concurrent
commit to the same branch is refused instead of silently dropped.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import settings
from ..errors import ConcurrentUpdate, InvalidArgument, NothingToCommit, PackMissing, StaleWrite
from ..codec.device_choice import commit_device, data_location
from ..model.versions import Commit, Tree, check_metadata
from ..progress import NULL, Progress
from ..store.config_keys import MERGE_HEAD, MERGE_RECIPE
from ..store.refs import HEADS
from ..worktree.refresh import SourceCopies, StateDictSource, refresh_worktree
from ..worktree.scan import StatCache, scan
from ..worktree.chunking import STATE_DICT_PATH, TreeBuilder, TensorStream

log = logging.getLogger(__name__)


RECORD_ATTEMPTS = 3  # encodings of one commit, each refused only if a prune re-encoded its bases meanwhile


@dataclass
class CommitResult:
    commit: str
    tree: str
    parents: tuple[str, ...]
    logical_bytes: int
    stored_bytes: int
    new_objects: int
    linked_files: list[str] = field(default_factory=list)  # symlinks committed as their files' content
    skipped_symlinks: list[str] = field(default_factory=list)  # dangling or to a directory: not committed
    nested_repositories: list[str] = field(default_factory=list)  # skipped, like git submodules

    def to_json(self):
        return {
            "linked_files": self.linked_files,
            "skipped_symlinks": self.skipped_symlinks,
            "nested_repositories": self.nested_repositories,
            "commit": self.commit,
            "tree": self.tree,
            "parents": list(self.parents),
            "logical_bytes": self.logical_bytes,
            "stored_bytes": self.stored_bytes,
            "new_objects": self.new_objects,
        }


def default_author() -> str:
    if author := settings.text("WVC_AUTHOR"):
        return author
    try:
        return f"{getpass.getuser()}@{_host_name()}"
    except Exception as exc:  # noqa: BLE001 - no user name is no reason to refuse a commit
        log.debug("no user name for the author (%s): 'unknown'", exc)
        return "unknown"


def _host_name() -> str:
    """What ``socket.gethostname()`` says, without importing socket on every commit (~3 ms of
    a 0.2 s one): on POSIX both are uname's node name."""
    try:
        return os.uname().nodename
    except AttributeError:  # (Windows)
        import socket

        return socket.gethostname()


def commit(
    repo,
    message: str,
    source=None,
    *,
    author: str | None = None,
    metadata: dict | None = None,
    allow_empty: bool = False,
    device: str = "auto",
    state_dict_path: str = STATE_DICT_PATH,
    branch: str | None = None,
    exclude: tuple[str, ...] = (),
    amend: bool = False,
    progress: Progress = NULL,
) -> CommitResult:
    """Commit ``source`` (working tree, another directory or a state dict).

    ``branch`` commits onto that branch (created from HEAD if missing) without checking
    it out: the training callback records a run this way while the working tree stays.
    ``exclude`` adds gitignore-style patterns for a directory source. ``amend`` replaces
    HEAD's commit (same parents; ``message`` None keeps its message, ``metadata`` None its
    metadata); the replaced one stays in the reflog. Committing the
    working tree holds its lock: a checkout in another process cannot change it meanwhile.
    """
    def attempts():
        # A prune in another process may re-encode the delta bases this commit's chunks were
        # encoded against between the encoding and the record, which then refuses it
        # (StaleWrite, nothing recorded): encoded again against the bases as they are now.
        for attempt in range(1, RECORD_ATTEMPTS + 1):
            try:
                with contextlib.ExitStack() as held:  # (what an attempt leaves behind, e.g. SourceCopies)
                    return _commit(repo, message, source, author=author, metadata=metadata, allow_empty=allow_empty,
                                   device=device, state_dict_path=state_dict_path, branch=branch, exclude=exclude,
                                   amend=amend, progress=progress, held=held)
            except (StaleWrite, PackMissing):  # (a base read from rows a gc or prune just moved)
                if attempt == RECORD_ATTEMPTS:
                    raise

    if source is None or (isinstance(source, (str, os.PathLike)) and Path(source).resolve() == repo.root):
        with repo.worktree_lock("commit"):
            return attempts()
    return attempts()


def _commit(repo, message, source, *, author, metadata, allow_empty, device, state_dict_path, branch, exclude,
            amend, progress, held: contextlib.ExitStack) -> CommitResult:
    amended = None
    if amend:
        if branch is not None:
            raise InvalidArgument("--amend works on HEAD's commit; it cannot be combined with a branch")
        head = repo.refs.head_commit()
        if head is None:
            raise NothingToCommit("nothing to amend: HEAD has no commits yet")
        amended = repo.read_commit(head)
        message = amended.message if message is None else message
        metadata = amended.metadata if metadata is None else metadata
    if message is None:
        raise InvalidArgument("a commit needs a message")
    metadata = check_metadata(metadata or {})
    merge_head = repo.db.get_config(MERGE_HEAD) if branch is None and source is None else None
    if merge_head is not None:
        import json

        metadata = {**metadata, "merge": json.loads(repo.db.get_config(MERGE_RECIPE) or "{}")}
    if branch is not None:
        from ..store.refs import check_ref_name

        check_ref_name(branch)
        branch_before = repo.refs.get(HEADS + branch)
        parent_id = branch_before or repo.refs.head_commit()
    else:
        parent_id = repo.refs.head_commit()
    head_before = repo.refs.head()
    parent_tree = repo.read_tree(repo.read_commit(parent_id).tree) if parent_id else None
    chunk_bytes = parent_tree.chunk_bytes if parent_tree else repo.chunk_bytes
    root = repo.root if source is None or isinstance(source, (str, os.PathLike)) else None
    if root is not None and source is not None:
        root = Path(source).resolve()
    stat_cache = StatCache(repo.db, root) if root == repo.root else None
    scanned = None
    if root is not None:
        scanned = scan(root, exclude)
        scanned.refuse_bad_names()  # before anything is written

    # onto HEAD's branch from another directory, the working tree is refreshed: the files it will
    # take are written as they are read (worktree/refresh.SourceCopies)
    copies = held.enter_context(SourceCopies(repo.root)) \
        if root not in (None, repo.root) and (branch is None or branch == repo.refs.head_branch()) else None
    with repo.store.writer(device=commit_device(device, data_location(source)), max_chain=repo.max_chain) as writer:
        snap = TreeBuilder(writer, parent_tree, chunk_bytes, progress, tee=copies)
        if isinstance(source, TensorStream):
            if parent_tree is None:
                raise InvalidArgument("a streamed commit needs a parent version: its files say where each tensor goes")
            tree = Tree(snap.tensor_stream(source), chunk_bytes)
        elif isinstance(source, Mapping):
            entry = snap.state_dict_file(source, state_dict_path)
            files = {f.path: f.with_content_id() for f in (parent_tree.files if parent_tree else ())}
            files[entry.path] = entry
            tree = Tree(tuple(files[p] for p in sorted(files)), chunk_bytes)
        else:
            tree = snap.directory(root, scanned.files, stat_cache or StatCache(repo.db, root))
        if parent_tree is not None and parent_tree.files and not tree.files and not allow_empty:
            raise NothingToCommit(f"refusing to record a version with no files: every one of the parent's "
                                  f"{len(parent_tree.files)} files is missing from {root or 'the source'}; "
                                  "`wvc checkout HEAD -- .` restores them, --allow-empty records the deletion")
        if parent_tree is not None and tree.id == parent_tree.id and not allow_empty and merge_head is None \
                and amended is None:
            raise NothingToCommit("nothing to commit: the working tree matches HEAD (use --allow-empty)")
        pack, rows = writer.finish()

    parents = ((parent_id,) if parent_id else ()) + ((merge_head,) if merge_head else ())
    if amended is not None:  # snapshotted against the amended commit (its chunks are delta bases),
        parents = amended.parents  # recorded in its place
    summary = f"commit (amend): {message.splitlines()[0] if message else ''}" if amended else None
    new = Commit(tree.id, parents, author or default_author(), int(time.time()), message, metadata)
    def move_refs():  # HEAD's rules, in the record's transaction
        nonlocal stat_cache
        if branch is not None:
            repo.refs.set(HEADS + branch, new.id, branch_before, f"commit: {new.summary}")  # CAS
            stat_cache = None  # the working tree was not the source
        elif repo.refs.head() != head_before:
            raise ConcurrentUpdate("HEAD moved while committing; retry")
        elif (head_branch := repo.refs.head_branch()) is not None:
            repo.refs.set(HEADS + head_branch, new.id, parent_id, summary or f"commit: {new.summary}")
        else:
            repo.refs.set_head(new.id, summary or f"commit (detached): {new.summary}")
        if stat_cache is not None:
            stat_cache.flush(in_transaction=True)
        if merge_head is not None:
            repo.db.delete_config(MERGE_HEAD)
            repo.db.delete_config(MERGE_RECIPE)

    repo.record([(new, tree, writer.stored_bytes)], packs=[(pack, rows)], during=move_refs)
    if root != repo.root and (branch is None or branch == repo.refs.head_branch()):
        refresh_worktree(repo, parent_tree, tree, progress,  # HEAD's new version came from elsewhere
                      source=StateDictSource(state_dict_path, source) if isinstance(source, Mapping) else copies)
    result = CommitResult(new.id, tree.id, parents, tree.logical_bytes, writer.stored_bytes, len(rows))
    if scanned is not None:
        result.linked_files = scanned.linked_files
        result.skipped_symlinks = scanned.skipped_symlinks
        result.nested_repositories = scanned.nested_repositories
    return result
