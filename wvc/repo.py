"""The repository: opens ``.wvc/`` and composes the database, object store and refs.

Every verb of the CLI is a method here with the same name; the heavy lifting lives in
:mod:`wvc.ops`. Importing this module does not import torch: only operations that touch
tensor bytes (commit, checkout, diff, load_state_dict) pull it in.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import ids
from .errors import FormatError, NotARepository, RepositoryExists, RevisionNotFound
from .objects import Commit, Tree
from .progress import NULL, Progress
from .store.database import Database
from .store.external import ExternalFiles
from .store.objects import DEFAULT_MAX_CHAIN, ObjectStore
from .store.refs import HEADS, Refs

WVC_DIR = ".wvc"
DEFAULT_CHUNK_BYTES = 4 << 20
FORMAT_VERSION = "1"


class Repo:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.wvc_dir = self.root / WVC_DIR
        self.db = Database(self.wvc_dir / "wvc.db")
        self.db.migrate()
        self.store = ObjectStore(self.db, self.wvc_dir / "packs", ExternalFiles(self._locate_base))
        self.refs = Refs(self.db)
        self.store.fetch_missing = self.ensure_objects  # a lazy clone fetches chunks on first use
        self.lazy_downloaded = 0

    def _locate_base(self) -> Path:
        from .ops.base_model import locate

        return locate(self)

    def ensure_objects(self, object_ids, progress: Progress = NULL) -> None:
        """Make chunks local: a no-op unless this is a lazy clone (ops/partial.py) lacking some."""
        from .ops.partial import fetch_objects, lazy_remote

        if lazy_remote(self) is None:
            return

        self.lazy_downloaded += fetch_objects(self, object_ids, progress)

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def init(cls, path=".", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_chain: int = DEFAULT_MAX_CHAIN,
             branch: str = "main", base: str | None = None, progress: Progress = NULL) -> "Repo":
        """Create ``.wvc/`` in ``path``. ``base`` (hf://org/name[@rev] or a directory) becomes
        the root of history, referenced in place (ops/base_model.py); on any failure nothing is left."""
        import shutil

        from .store.refs import check_ref_name

        root = Path(path).resolve()
        check_ref_name(branch)
        if (root / WVC_DIR).exists():
            raise RepositoryExists(f"{root} already holds a wvc repository")
        created_root = not root.exists()
        root.mkdir(parents=True, exist_ok=True)
        (root / WVC_DIR / "packs").mkdir(parents=True)
        repo = cls(root)
        try:
            with repo.db.write():
                repo.db.set_config("format", FORMAT_VERSION)
                repo.db.set_config("chunk_bytes", str(chunk_bytes))
                repo.db.set_config("max_chain", str(max_chain))
                repo.db.set_config("HEAD", "ref: " + HEADS + branch)
            if base is not None:
                from .ops.base_model import attach

                attach(repo, base, progress=progress)
        except BaseException:
            repo.close()
            shutil.rmtree(root if created_root else root / WVC_DIR, ignore_errors=True)
            raise
        return repo

    def base(self):
        """The base this history starts from (:class:`wvc.ops.base_model.BaseRef`), or None."""
        from .ops.base_model import current

        return current(self)

    @classmethod
    def open(cls, path=".") -> "Repo":
        """The repository at ``path`` or the nearest directory above it."""
        start = Path(path).resolve()
        for candidate in (start, *start.parents):
            if (candidate / WVC_DIR / "wvc.db").is_file():
                repo = cls(candidate)
                fmt = repo.db.get_config("format")
                if fmt != FORMAT_VERSION:
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

    @staticmethod
    def resolve_device(device: str) -> str:
        """``auto`` is cuda when a GPU is usable, else cpu; torch is imported only to check a GPU."""
        if device not in ("auto", "cpu", "cuda", "torch-cpu") and not device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
        if device != "auto":
            return device
        if not os.path.exists("/proc/driver/nvidia/version"):  # no NVIDIA driver: no CUDA
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    # -- reading objects -------------------------------------------------------------------
    def resolve(self, rev: str) -> str:
        from .ops.revparse import resolve

        return resolve(self, rev)

    def read_commit(self, commit_id: str) -> Commit:
        data = self.db.one("SELECT data FROM commits WHERE id = ?", (commit_id,))
        if data is None:
            raise RevisionNotFound(f"commit {ids.short(commit_id)} is not in this repository")
        return Commit.from_bytes(data)

    def read_tree(self, tree_id: str) -> Tree:
        data = self.db.one("SELECT data FROM trees WHERE id = ?", (tree_id,))
        if data is None:
            raise RevisionNotFound(f"tree {ids.short(tree_id)} is not in this repository")
        return Tree.from_bytes(data)

    def tree_of(self, rev: str) -> Tree:
        return self.read_tree(self.read_commit(self.resolve(rev)).tree)

    # -- verbs -----------------------------------------------------------------------------
    def status(self):
        from .ops.status import status

        return status(self)

    def commit(self, message: str, source=None, **kwargs):
        """Commit the working tree, another directory, or a state dict (``source``)."""
        from .ops.commit import commit

        return commit(self, message, source, **kwargs)

    def checkout(self, rev: str, *, force: bool = False, output=None, progress: Progress = NULL):
        from .ops.checkout import checkout

        return checkout(self, rev, force=force, output=output, progress=progress)

    def log(self, rev: str = "HEAD", n: int | None = None, all_refs: bool = False):
        from .ops.history import log

        return log(self, rev, n, all_refs)

    def show(self, rev: str = "HEAD"):
        from .ops.history import show

        return show(self, rev)

    def diff(self, rev_a: str | None = None, rev_b: str | None = None, *, stat: bool = False):
        from .ops.diff import diff

        return diff(self, rev_a, rev_b, stat=stat)

    def load_state_dict(self, rev: str = "HEAD", *, device: str = "cpu", lazy: bool = False):
        from .ops.tensors import load_state_dict

        return load_state_dict(self, rev, device=device, lazy=lazy)

    def branches(self) -> dict[str, str]:
        return self.refs.list(HEADS)

    def create_branch(self, name: str, start: str = "HEAD") -> str:
        from .ops.branches import create_ref

        return create_ref(self, HEADS, name, start, "branch")

    def delete_branch(self, name: str) -> str:
        from .ops.branches import delete_branch

        return delete_branch(self, name)

    def tags(self) -> dict[str, str]:
        from .store.refs import TAGS

        return self.refs.list(TAGS)

    def create_tag(self, name: str, rev: str = "HEAD") -> str:
        from .ops.branches import create_ref
        from .store.refs import TAGS

        return create_ref(self, TAGS, name, rev, "tag")

    def delete_tag(self, name: str) -> str:
        from .ops.branches import delete_tag

        return delete_tag(self, name)

    # -- remotes ---------------------------------------------------------------------------
    def remotes(self) -> dict[str, str]:
        from .ops.sync import remotes

        return remotes(self)

    def remote_add(self, name: str, url: str) -> None:
        from .ops.sync import remote_add

        remote_add(self, name, url)

    def remote_remove(self, name: str) -> None:
        from .ops.sync import remote_remove

        remote_remove(self, name)

    def push(self, remote: str = "origin", branch: str | None = None, *, force: bool = False, progress: Progress = NULL):
        from .ops.sync import push

        return push(self, remote, branch, force=force, progress=progress)

    def fetch(self, remote: str = "origin", *, progress: Progress = NULL):
        from .ops.sync import fetch

        return fetch(self, remote, progress=progress)

    def pull(self, remote: str = "origin", branch: str | None = None, *, rebase: bool = False,
             progress: Progress = NULL):
        from .ops.sync import pull

        return pull(self, remote, branch, rebase=rebase, progress=progress)

    def remote_branches(self) -> dict[str, str]:
        return self.refs.list("refs/remotes/")

    def gc(self, *, grace_seconds: int = 3600):
        from .ops.maintenance import gc

        return gc(self, grace_seconds=grace_seconds)

    def fsck(self):
        from .ops.maintenance import fsck

        return fsck(self)

    def stats(self):
        from .ops.maintenance import stats

        return stats(self)


def clone(url: str, directory=None, *, branch: str | None = None, lazy: bool = False,
          progress: Progress = NULL) -> Repo:
    """Clone ``url`` (``hf://user/repo`` or a path) into ``directory``; returns the Repo.

    ``lazy``: fetch commits and trees only; chunks are fetched when first needed."""
    from .ops.sync import clone as _clone

    return _clone(url, directory, branch=branch, lazy=lazy, progress=progress)[0]


