"""Clone: a new repository, the remote's base attached (verified against its record), then
fetch and check out one branch. ``lazy``: commits and trees now, chunks on first use."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import PathInTheWay, RemoteError, RevisionNotFound
from ..progress import NULL, Progress
from ..remotes import local_path, open_backend
from ..store.config_keys import CLONE_INCOMPLETE, LAZY_REMOTE as LAZY_REMOTE_KEY
from ..remotes.repository import RemoteRepository
from ..repo import INIT_PREFIX, Repository, remove_new_repository
from ..store.database import peek_config
from ..store.refs import HEADS
from .fetch import fetch
from .pull import pull
from ..basemodel.remote import set_remote_base, base_directory, remote_base
from .remote_config import index_cache, remote_add


# Set when the clone's repository is created, cleared when the clone is done: a clone that
# was killed (no chance to clean up) is recognised by it, and a re-run starts afresh.


def _interrupted_clone(target: Path) -> bool:
    """Whether ``target`` holds only what a killed clone left: a repository still marked
    incomplete, or (killed while its repository was being made) only init's staging folders."""
    db = target / ".wvc" / "wvc.db"
    if not db.is_file():
        entries = list(target.iterdir()) if target.is_dir() else []
        return bool(entries) and all(e.name.startswith(INIT_PREFIX) and e.is_dir() for e in entries)
    return peek_config(db, CLONE_INCOMPLETE)[1] is not None


def _absolute(url: str) -> str:
    """A directory URL given to clone is relative to where clone runs, not to the clone."""
    path = local_path(url)
    return url if path is None else str(Path(path).expanduser().resolve())


def clone(url: str, directory=None, *, branch: str | None = None, lazy: bool = False, base_dir=None,
          progress: Progress = NULL) -> tuple[Repository, dict]:
    """``base_dir``: where this machine has the model a remote's directory base names (a
    remote's own record is never read as a local path: basemodel/remote.base_directory)."""
    remote = open_backend(url)
    if directory is None:
        directory = url.rstrip("/").rpartition("/")[2].removesuffix(".wvc") or "model"
    target = Path(directory)
    if _interrupted_clone(target):  # everything in it came from that clone: start again
        for child in target.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise PathInTheWay(f"destination {target} exists and is not an empty directory")
    # the one listing of this clone, before anything is created (an unusable remote fails
    # here); the base, the fetch and the pull all read it
    pinned = RemoteRepository.open(remote)
    heads = [r[len(HEADS):] for r in pinned.refs if r.startswith(HEADS)]
    if not heads:
        raise RemoteError(f"{url} has no branches")
    branch = branch or ("main" if "main" in heads else sorted(heads)[0])
    if branch not in heads:
        raise RevisionNotFound(f"{url} has no branch {branch!r}")
    base = remote_base(pinned.base_record, url)
    base_dir = base_directory(base, url, base_dir)  # before anything is created
    created = not target.exists()
    repo, base_info = None, None
    try:
        settings = {CLONE_INCOMPLETE: url, **({LAZY_REMOTE_KEY: "origin"} if lazy else {})}
        repo = Repository.create(target, branch=branch, settings=settings)
        pinned = RemoteRepository(remote, pinned.state, index_cache(repo))  # (the same listing)
        if base is not None:
            base_info = set_remote_base(repo, pinned, base, progress, base_dir)
        remote_add(repo, "origin", _absolute(url))
        fetched = fetch(repo, "origin", progress=progress, remote=pinned)
        pull(repo, "origin", branch, progress=progress, fetched=fetched)
    except BaseException:
        if repo is not None:
            repo.close()
        remove_new_repository(target.resolve(), created)
        raise
    with repo.db.write():
        repo.db.delete_config(CLONE_INCOMPLETE)
    head = repo.refs.head_commit()
    return repo, {"path": str(repo.root), "branch": branch, "commit": head, "lazy": lazy,
                  "downloaded_bytes": fetched.downloaded_bytes + repo.lazy_downloaded,
                  "logical_bytes": repo.read_tree(repo.read_commit(head).tree).logical_bytes, "base": base_info}
