"""The composition root: opens ``.wvc/`` and builds what a repository is made of.

A :class:`Repository` holds the database, the commit graph, the object store (with the
chunk sources it may read from: a base model's files, a lazy clone's remote) and the refs,
and reads commits and trees. It runs no verb: those are in :mod:`wvc.ops`, and the public
``wvc.Repo`` (wvc/api.py) puts them behind methods. Importing this module imports no torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .basemodel.base_ref import BaseRef, current
from . import ids
from .errors import FormatError, InvalidArgument, NotARepository, RepositoryExists, VersionPruned
from .fsutil import file_lock, fsync_dir, umask
from .model.versions import Commit, Tree, check_chunk_bytes
from .remotes import lazy_remote_name
from .store.revparse import resolve
from .store import config_keys
from .store.chains import MAX_CHAIN_LIMIT, MAX_CHAIN_LINKS
from .store.database import Database, has_rows, peek_config
from .store.external import ExternalFiles
from .store.graph import CommitGraph
from .store.chunks import DEFAULT_MAX_CHAIN, ObjectStore
from .store.refs import HEADS, Refs, check_ref_name

WVC_DIR = ".wvc"
WORKTREE_LOCK = "worktree.lock"
# Held by the verbs that rewrite stored objects' rows (prune, gc): each plans from the rows
# it reads and applies the plan later, so two of them must never overlap (docs/design.md,
# "prune"). Commits do not take it: they only add rows, and are checked at their record.
MAINTENANCE_LOCK = "maintenance.lock"
INIT_PREFIX = ".wvc-tmp-init-"  # an init under way (fsutil.TEMP_PREFIX: scans skip it)
DEFAULT_CHUNK_BYTES = 4 << 20
FORMAT_VERSION = "1"  # what init writes
# what open accepts: "2" once the local database holds a tree delta (store/graph.py)
FORMATS = (FORMAT_VERSION, "2")


def check_max_chain(n) -> int:
    if type(n) is not int or not 0 <= n <= MAX_CHAIN_LIMIT:
        raise InvalidArgument(f"max chain {n!r} is not allowed: use 0 to {MAX_CHAIN_LIMIT} "
                              "(0: every changed chunk a keyframe)")
    return n


class Repository:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.wvc_dir = self.root / WVC_DIR
        self.db = Database(self.wvc_dir / "wvc.db")
        self.db.migrate()
        self._worktree_locks = 0
        self.graph = CommitGraph(self.db)
        self.refs = Refs(self.db)
        supply = None
        if lazy_remote_name(self.db) is not None:
            from .remotes.lazy import LazyRemote  # the transfer machinery: loaded by lazy clones only

            supply = LazyRemote(self.db, self.wvc_dir / "remote-idx", self.wvc_dir)
        max_links = max(MAX_CHAIN_LINKS, self.max_chain + 1)
        self.store = ObjectStore(self.db, self.wvc_dir / "packs", ExternalFiles(self._locate_base_files), supply,
                                 max_links)

    def _locate_base_files(self):
        """Where the base model's files are (found, or downloaded again, on the first read of one)."""
        from .basemodel.setup import locate

        return locate(self.db)

    # -- creating and opening --------------------------------------------------------------
    @classmethod
    def create(cls, path=".", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_chain: int = DEFAULT_MAX_CHAIN,
               branch: str = "main", settings: dict[str, str] | None = None):
        """Create ``.wvc/`` in ``path`` (and ``path`` if needed). Every argument is checked
        before anything is created; ``settings`` are extra config entries (a lazy clone's)."""
        try:
            check_chunk_bytes(chunk_bytes)
        except FormatError as exc:
            raise InvalidArgument(str(exc)) from exc
        check_max_chain(max_chain)
        check_ref_name(branch)
        root = Path(path).resolve()
        if (root / WVC_DIR).exists() and not _interrupted_init(root / WVC_DIR):
            raise RepositoryExists(f"{root} already holds a wvc repository")
        created_root = not root.exists()
        # Built whole in a temp directory and renamed to .wvc last: a killed init leaves no
        # half-made repository (that nothing would open and init would refuse), only a
        # temp directory that the next init removes.
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(INIT_PREFIX + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        if (root / WVC_DIR).exists():  # an older wvc's interrupted init: no format row, no refs
            shutil.rmtree(root / WVC_DIR)
        staging = Path(tempfile.mkdtemp(prefix=INIT_PREFIX, dir=root))
        try:
            (staging / "packs").mkdir()
            db = Database(staging / "wvc.db")
            try:
                db.migrate()
                with db.write():
                    for key, value in {config_keys.FORMAT: FORMAT_VERSION,
                                       config_keys.CHUNK_BYTES: str(chunk_bytes),
                                       config_keys.MAX_CHAIN: str(max_chain),
                                       config_keys.HEAD: "ref: " + HEADS + branch,
                                       **(settings or {})}.items():
                        db.set_config(key, value)
            finally:
                db.close()
            os.chmod(staging, 0o777 & ~umask())  # mkdtemp's 0700 would hide it from a team
            os.rename(staging, root / WVC_DIR)
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if created_root:
                shutil.rmtree(root, ignore_errors=True)
            raise
        return cls(root)

    @classmethod
    def open(cls, path="."):
        """The repository at ``path`` or the nearest directory above it."""
        start = Path(path).resolve()
        for candidate in (start, *start.parents):
            if (candidate / WVC_DIR / "wvc.db").is_file():
                if _interrupted_init(candidate / WVC_DIR):
                    raise FormatError(f"{candidate / WVC_DIR} was left by an interrupted `wvc init`: "
                                      "run `wvc init` again")
                repo = cls(candidate)
                fmt = repo.db.get_config(config_keys.FORMAT)
                if fmt not in FORMATS:
                    repo.close()
                    raise FormatError(f"repository format {fmt!r} is not supported by this wvc")
                return repo
        raise NotARepository(f"not a wvc repository (or any parent up to /): {start}")

    @contextlib.contextmanager
    def maintenance_lock(self, verb: str, timeout: float | None = None):
        """Held for the whole of a prune or a gc: a second one waits (WVC_LOCK_TIMEOUT), then
        refuses naming the holder. The kernel drops it when its process dies."""
        with file_lock(self.wvc_dir / MAINTENANCE_LOCK, f"wvc {verb} (pid {os.getpid()})", timeout,
                       what="the repository (for prune and gc)"):
            yield

    @contextlib.contextmanager
    def worktree_lock(self, verb: str, timeout: float | None = None):
        """Held by every verb that reads or writes the working tree as a whole (commit,
        checkout, pull, merge, reset): a commit never records half of a checkout. Re-entrant
        within one Repository (pull's checkout, merge's)."""
        if self._worktree_locks:
            self._worktree_locks += 1
            try:
                yield
            finally:
                self._worktree_locks -= 1
            return
        with file_lock(self.wvc_dir / WORKTREE_LOCK, f"wvc {verb} (pid {os.getpid()})", timeout):
            self._worktree_locks = 1
            try:
                yield
            finally:
                self._worktree_locks = 0

    def close(self) -> None:
        """Release the database and the pack files (also on leaving a ``with`` block)."""
        self.store.reader.close()
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    # -- settings --------------------------------------------------------------------------
    @property
    def chunk_bytes(self) -> int:
        """The chunk size new files are split into (a tree keeps the one it was made with)."""
        return int(self.db.get_config(config_keys.CHUNK_BYTES, str(DEFAULT_CHUNK_BYTES)))

    @property
    def max_chain(self) -> int:
        """How many deltas a chain may hold before a chunk is stored whole again."""
        return int(self.db.get_config(config_keys.MAX_CHAIN, str(DEFAULT_MAX_CHAIN)))

    def base(self) -> BaseRef | None:
        """The base model this history starts from, or None."""
        return current(self.db)

    @property
    def lazy_downloaded(self) -> int:
        """Bytes a lazy clone has fetched on first use in this process."""
        return self.store.supply.downloaded_bytes if self.store.supply is not None else 0

    # -- reading ---------------------------------------------------------------------------
    def resolve(self, rev: str) -> str:
        """The commit id a REV names (wvc/store/revparse.py)."""
        return resolve(self.refs, self.graph, rev)

    def read_commit(self, commit_id: str) -> Commit:
        """The commit with this full id (verified when it was stored)."""
        return self.graph.read_commit(commit_id)

    def read_tree(self, tree_id: str) -> Tree:
        """The tree (a version's files) with this id."""
        return self.graph.read_tree(tree_id)

    def tree_of(self, rev: str, *, weights: bool = True) -> Tree:
        """The tree of the commit ``rev`` names. ``weights``: the caller will read its chunks,
        so a version `wvc prune` dropped is refused (VersionPruned), naming the nearest kept ones;
        False: only its listing (names, shapes, chunk ids) is wanted."""
        commit_id = self.resolve(rev)
        if weights:
            self.require_weights(commit_id)
        return self.read_tree(self.read_commit(commit_id).tree)

    def require_weights(self, commit_id: str) -> None:
        """Raise VersionPruned if ``commit_id``'s weights were dropped by `wvc prune`."""
        if not self.graph.is_pruned(commit_id):
            return
        before, after = self.graph.nearest_kept(commit_id)
        near = [f"{ids.short(c)} ({n} {'commit' if n == 1 else 'commits'} {side})"
                for found, side in ((before, "earlier"), (after, "later")) if found for c, n in [found]]
        raise VersionPruned(f"version {ids.short(commit_id)} was pruned (wvc prune): its log entry stays, its weights "
                            f"are gone; nearest kept: {', '.join(near) or 'none'}")

    # -- recording -------------------------------------------------------------------------
    def record(self, versions, *, packs=(), externals=None, ref: str | None = None, expected: str | None = None,
               reason: str = "", during=None) -> None:
        """Record new versions in one transaction, the only way a version enters history.

        ``versions``: (commit, its tree, stored bytes) in parent-first order; ``packs``:
        (pack, rows) the writers finished, whose rows go in first (``externals``: a base
        model's chunk locations, store.add_external). Then every chunk the trees
        name must be present: a gc may have removed an unreachable chunk a writer
        deduplicated against between its plan and now, and a tree naming a missing chunk
        would be a version that cannot be checked out (MissingObject; nothing recorded); and
        every new pack must still be there and every new delta's base as its writer read it
        (StaleWrite: a gc or prune changed them meanwhile; nothing recorded).
        Then the trees and commits, and ``ref`` moved from ``expected`` to the last commit by
        compare-and-swap with a reflog entry ``reason`` (None: no ref moves here; a merge
        moves its branch after the working tree). ``during(db)``: more writes of the same
        transaction (commit's stat cache and HEAD rules, set_base's settings)."""
        from .errors import MissingObject

        with self.db.write():
            for pack, rows in packs:
                self.store.insert_rows(pack, rows)
            for pack, rows in packs:  # (after all: a batch's delta may be on another's chunk)
                if pack is not None:
                    self.store.check_new_pack(pack, rows)
            if externals is not None:
                self.store.add_external(externals)
            chunks = set().union(*(tree.chunk_ids() for _, tree, _ in versions)) if versions else set()
            missing = chunks - self.store.present(chunks)
            if missing:
                raise MissingObject(f"{len(missing)} objects vanished while this version was being written "
                                    "(a concurrent gc?); nothing was recorded: retry")
            for commit, tree, stored in versions:
                self.graph.add_tree(tree, self.graph.tree_of(commit.parents[0]) if commit.parents else None)
                self.graph.add_commit(commit, stored)
            if ref is not None:
                self.refs.set(ref, versions[-1][0].id, expected, reason)
            if during is not None:
                during()


def _interrupted_init(wvc_dir: Path) -> bool:
    """Whether ``wvc_dir`` is, positively, what an older wvc's killed init left: a database
    that reads, without the format row that init writes in its only transaction, and with no
    refs and no commits. A database that cannot be read (locked, not readable, damaged)
    raises DatabaseUnavailable: only evidence read from it may make ``init`` replace it."""
    db = wvc_dir / "wvc.db"
    if not db.is_file():  # killed between mkdir and the database: nothing but empty folders
        return wvc_dir.is_dir() and all(p.is_dir() and not any(p.iterdir()) for p in wvc_dir.iterdir())
    has_config, fmt = peek_config(db, config_keys.FORMAT)
    if has_config and fmt is not None:
        return False
    return not has_rows(db, "refs") and not has_rows(db, "commits")


def remove_new_repository(root: Path, created_root: bool) -> None:
    """Undo a repository creation that failed: nothing of it is left."""
    shutil.rmtree(root if created_root else root / WVC_DIR, ignore_errors=True)
