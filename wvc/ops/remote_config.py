"""Remote configuration: add, remove and list named remotes, and open one by name."""

from __future__ import annotations

import os

from ..errors import WvcError
from ..remotes import open_remote, remote_url
from ..store.refs import check_ref_name

REMOTES = "refs/remotes/"


def anchored(repo, url: str) -> str:
    """A directory remote's path made absolute against the repository root (not the current
    directory: pushing from a subdirectory must reach the same remote); URLs unchanged."""
    path = url[len("file://"):] if url.startswith("file://") else url
    if "://" in path or os.path.isabs(os.path.expanduser(path)):
        return url
    return str((repo.root / path).resolve())


def remote_add(repo, name: str, url: str) -> None:
    check_ref_name(name, "remote")
    url = anchored(repo, url)
    open_remote(url)  # an unsupported or malformed URL is refused now, not at the first push
    with repo.db.write():
        if repo.db.get_config(f"remote.{name}.url") is not None:
            raise WvcError(f"remote {name!r} already exists")
        repo.db.set_config(f"remote.{name}.url", url)


def remote_remove(repo, name: str) -> None:
    with repo.db.write():
        if repo.db.get_config(f"remote.{name}.url") is None:
            raise WvcError(f"no remote named {name!r}")
        repo.db.delete_config(f"remote.{name}.url")
        for branch in repo.refs.list(f"{REMOTES}{name}/"):
            repo.refs.delete(f"{REMOTES}{name}/{branch}", "remote removed")


def remotes(repo) -> dict[str, str]:
    return {k[len("remote."):-len(".url")]: v for k, v in repo.db.config_like("remote.%.url")}


def open_remote_named(repo, name: str):
    return open_remote(anchored(repo, remote_url(repo.db, name)))  # (an older wvc stored paths as given)


def index_cache(repo):
    """Where remote pack indexes are kept once read (packs are immutable)."""
    return repo.wvc_dir / "remote-idx"
