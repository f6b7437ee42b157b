"""Remotes: where repositories meet. One interface (``interface.Backend``), four backends:
a directory (``path``: a shared disk or NFS team folder), a Hugging Face Hub model repo
(``hub``), a Hugging Face Storage Bucket (``bucket``: no commits, refs through a log) and an
S3-protocol bucket (``s3``). ``layout`` spells every path of a remote, ``repository`` alone knows what
the files mean; ``downloads`` moves and verifies what crosses; ``lazy`` supplies a lazy clone's
chunks on first use. The verbs (push, fetch, pull, clone) are in ``wvc.ops``."""

from __future__ import annotations

from ..store import config_keys
from .layout import LAYOUT
from .urls import local_path, parse

__all__ = ["open_backend", "hub_model_files", "local_path", "remote_url", "lazy_remote_name"]


def open_backend(url: str):
    """The backend for ``url``: ``hf://user/repo``, ``hf://buckets/namespace/bucket[/prefix]``,
    ``s3://bucket/prefix`` or a local path / ``file://`` URL (``urls.parse`` checks it), given
    the layout map it asks for the format's rules."""
    where = parse(url)
    if where.kind == "bucket":
        from .bucket import BucketBackend

        return BucketBackend(where.repo_id, LAYOUT, where.prefix)
    if where.kind == "hub":
        from .hub import HubBackend

        return HubBackend(where.repo_id, LAYOUT, where.revision)
    if where.kind == "s3":
        from .s3 import S3Backend, S3Location  # boto3: imported only when an s3 remote is used

        return S3Backend(S3Location(where.repo_id, where.prefix), LAYOUT)
    from .path import PathBackend

    return PathBackend(where.path, LAYOUT)


def hub_model_files(repo_id: str, sha: str | None = None):
    """A Hub model repository's files (a base model's: read, never pushed to), pinned to the
    commit ``sha`` when it is given."""
    from .hub import HubBackend

    return HubBackend(repo_id, LAYOUT, sha=sha)


def remote_url(db, name: str) -> str:
    """The URL of the remote ``name`` configured in a repository's database."""
    url = db.get_config(config_keys.remote_url_key(name))
    if url is None:
        from ..errors import NoSuchRemote

        raise NoSuchRemote(f"no remote named {name!r} (see `wvc remote add`)")
    return url


def lazy_remote_name(db) -> str | None:
    """The remote a lazy clone fetches chunks from (remotes/lazy.py), or None for a complete repository."""
    return db.get_config(config_keys.LAZY_REMOTE)
