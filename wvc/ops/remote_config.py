"""Remote configuration: add, remove and list named remotes, and open one by name."""

from __future__ import annotations

import os

from ..errors import NoSuchRemote, RemoteExists
from ..remotes import local_path, open_backend, remote_url
from ..store.config_keys import REMOTE_URL_KEYS, remote_of_url_key, remote_url_key as url_key
from ..store.refs import REMOTES, check_ref_name



def absolute_url(repo, url: str) -> str:
    """A directory remote's path made absolute against the repository root (not the current
    directory: pushing from a subdirectory must reach the same remote); URLs unchanged."""
    path = local_path(url)
    if path is None or os.path.isabs(os.path.expanduser(path)):
        return url
    return str((repo.root / path).resolve())


def remote_add(repo, name: str, url: str) -> None:
    check_ref_name(name, "remote")
    url = absolute_url(repo, url)
    open_backend(url)  # an unsupported or malformed URL is refused now, not at the first push
    with repo.db.write():
        if repo.db.get_config(url_key(name)) is not None:
            raise RemoteExists(f"remote {name!r} already exists")
        repo.db.set_config(url_key(name), url)


def remote_remove(repo, name: str) -> None:
    with repo.db.write():
        if repo.db.get_config(url_key(name)) is None:
            raise NoSuchRemote(f"no remote named {name!r}")
        repo.db.delete_config(url_key(name))
        for branch in repo.refs.list(f"{REMOTES}{name}/"):
            repo.refs.delete(f"{REMOTES}{name}/{branch}", "remote removed")


def remote_set_url(repo, name: str, url: str) -> None:
    url = absolute_url(repo, url)
    open_backend(url)
    with repo.db.write():
        if repo.db.get_config(url_key(name)) is None:
            raise NoSuchRemote(f"no remote named {name!r}")
        repo.db.set_config(url_key(name), url)


def remote_rename(repo, old: str, new: str) -> None:
    """Rename a remote; its remote-tracking branches move with it."""
    check_ref_name(new, "remote")
    with repo.db.write():
        url = repo.db.get_config(url_key(old))
        if url is None:
            raise NoSuchRemote(f"no remote named {old!r}")
        if repo.db.get_config(url_key(new)) is not None:
            raise RemoteExists(f"remote {new!r} already exists")
        repo.db.set_config(url_key(new), url)
        repo.db.delete_config(url_key(old))
        for branch, target in repo.refs.list(f"{REMOTES}{old}/").items():
            repo.refs.set(f"{REMOTES}{new}/{branch}", target, None, f"remote renamed from {old}")
            repo.refs.delete(f"{REMOTES}{old}/{branch}", f"remote renamed to {new}")


def remotes(repo) -> dict[str, str]:
    return {remote_of_url_key(k): v for k, v in repo.db.config_like(REMOTE_URL_KEYS)}


def open_remote_named(repo, name: str):
    return open_backend(absolute_url(repo, remote_url(repo.db, name)))  # (an older wvc stored paths as given)


def open_remote_repository(repo, name: str, *, create: bool = False):
    """Remote ``name`` listed once, for one operation (remotes/repository.py); its immutable
    files are kept in the repository's index cache."""
    from ..remotes.repository import RemoteRepository

    return RemoteRepository.open(open_remote_named(repo, name), index_cache(repo), create=create)


def index_cache(repo):
    """Where remote pack indexes are kept once read (packs are immutable)."""
    return repo.wvc_dir / "remote-idx"
