"""The composition root: opens ``.wvc/`` and builds what a repository is made of.

A :class:`Repository` holds the database, the commit graph, the object store (with the
chunk sources it may read from: a base model's files, a lazy clone's remote) and the refs,
and reads commits and trees. It runs no verb: those are in :mod:`wvc.ops`, and the public
``wvc.Repo`` (wvc/api.py) puts them behind methods. Importing this module imports no torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .basemodel.record import BaseRef, current
from .errors import FormatError, InvalidArgument, NotARepository, RepositoryExists
from .objects import Commit, Tree, check_chunk_bytes
from .remotes import lazy_remote_name
from .revparse import resolve
from .store.chains import MAX_CHAIN_LIMIT, MAX_CHAIN_LINKS
from .store.database import Database
from .store.external import ExternalFiles
from .store.graph import CommitGraph
from .store.objects import DEFAULT_MAX_CHAIN, ObjectStore
from .store.refs import HEADS, Refs, check_ref_name

WVC_DIR = ".wvc"
DEFAULT_CHUNK_BYTES = 4 << 20
FORMAT_VERSION = "1"


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
        from .basemodel.attach import locate

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
            raise InvalidArgument(str(exc)) from None
        check_max_chain(max_chain)
        check_ref_name(branch)
        root = Path(path).resolve()
        if (root / WVC_DIR).exists():
            raise RepositoryExists(f"{root} already holds a wvc repository")
        created_root = not root.exists()
        try:
            (root / WVC_DIR / "packs").mkdir(parents=True)
            repo = cls(root)
            with repo.db.write():
                for key, value in {"format": FORMAT_VERSION, "chunk_bytes": str(chunk_bytes),
                                   "max_chain": str(max_chain), "HEAD": "ref: " + HEADS + branch,
                                   **(settings or {})}.items():
                    repo.db.set_config(key, value)
        except BaseException:
            remove_new_repository(root, created_root)
            raise
        if settings:  # settings that change how the repository is built (lazy.remote)
            repo.close()
            repo = cls(root)
        return repo

    @classmethod
    def open(cls, path="."):
        """The repository at ``path`` or the nearest directory above it."""
        start = Path(path).resolve()
        for candidate in (start, *start.parents):
            if (candidate / WVC_DIR / "wvc.db").is_file():
                repo = cls(candidate)
                fmt = repo.db.get_config("format")
                if fmt != FORMAT_VERSION:
                    repo.close()
                    raise FormatError(f"repository format {fmt!r} is not supported by this wvc")
                return repo
        raise NotARepository(f"not a wvc repository (or any parent up to /): {start}")

    def close(self) -> None:
        self.store.reader.close()
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    # -- settings --------------------------------------------------------------------------
    @property
    def chunk_bytes(self) -> int:
        return int(self.db.get_config("chunk_bytes", str(DEFAULT_CHUNK_BYTES)))

    @property
    def max_chain(self) -> int:
        return int(self.db.get_config("max_chain", str(DEFAULT_MAX_CHAIN)))

    def base(self) -> BaseRef | None:
        """The base model this history starts from, or None."""
        return current(self.db)

    @property
    def lazy_downloaded(self) -> int:
        """Bytes a lazy clone has fetched on first use in this process."""
        return self.store.supply.downloaded_bytes if self.store.supply is not None else 0

    # -- reading ---------------------------------------------------------------------------
    def resolve(self, rev: str) -> str:
        """The commit id a REV names (wvc/revparse.py)."""
        return resolve(self.refs, self.graph, rev)

    def read_commit(self, commit_id: str) -> Commit:
        return self.graph.read_commit(commit_id)

    def read_tree(self, tree_id: str) -> Tree:
        return self.graph.read_tree(tree_id)

    def tree_of(self, rev: str) -> Tree:
        return self.read_tree(self.read_commit(self.resolve(rev)).tree)


def remove_new_repository(root: Path, created_root: bool) -> None:
    """Undo a repository creation that failed: nothing of it is left."""
    shutil.rmtree(root if created_root else root / WVC_DIR, ignore_errors=True)
