"""The base model a remote records, checked against this repository's and set up on clone."""

from __future__ import annotations

from .. import ids
from .setup import set_base
from .base_ref import base_commit, parse_base_json
from ..errors import BaseModelError, RemoteError
from ..progress import Progress


def remote_base(record: bytes | None, url: str):
    """The base model a remote's base record (untrusted bytes, or None) names, validated."""
    if record is None:
        return None
    try:
        base = parse_base_json(record)
    except BaseModelError as exc:
        raise RemoteError(f"{url}: {exc}") from exc
    if base_commit(base.url, base.tree).id != base.commit:
        raise RemoteError(f"remote base record is inconsistent: commit {ids.short(base.commit)} is not the root "
                          f"commit of {base.url}")
    return base


def base_directory(base, url: str, given) -> str | None:
    """Where to read a remote's directory base from: only a directory the user names. A
    remote records a directory base by its path on the pusher's machine; reading whatever
    that path names here would let a remote make wvc hash local files (an oracle on their
    contents) or block on a FIFO. A Hub base needs none (None)."""
    if base is None or base.is_hub:
        return None
    if given is None:
        raise RemoteError(f"{url} is based on the directory {base.url} of the machine that pushed it; wvc reads "
                          "no local directory a remote names: if you have that model here, pass its directory "
                          f"(--base-dir DIR, or base_dir=): e.g. --base-dir {base.url}")
    from pathlib import Path

    return str(Path(given).expanduser().resolve())


def check_same_base(remote_name: str, theirs, ours) -> None:
    if theirs is None or theirs == ours:
        return
    if ours is None:
        raise RemoteError(f"remote {remote_name} is based on {theirs.url}; this repository has no base "
                          f"(clone the remote instead, or `wvc init --base {theirs.url}`)")
    raise RemoteError(f"remote {remote_name} is based on {theirs.url}, this repository on {ours.url}")


def set_remote_base(repo, remote, base, progress: Progress, base_dir: str | None = None) -> dict:
    """Find or download the base a remote (a RemoteRepository) records and check it gives
    the recorded tree (a directory base: read from ``base_dir``, the user's, see
    base_directory). Returns :func:`base_report`'s account of it."""
    tree = remote.tree(base.tree)  # format 2: in the catalog of the first push
    spec = base.url if base.is_hub else base_directory(base, remote.url, base_dir)
    cached = set()
    if base.is_hub:
        from .download import cached_paths

        cached = cached_paths(base.url, [f.path for f in tree.files])
    set_base(repo, spec, expected=base, expected_tree=tree, set_branch=False, progress=progress)
    return base_report(base, tree.logical_bytes,
                       sum(f.size for f in tree.files if f.path not in cached) if base.is_hub else 0)


def base_report(base, logical_bytes: int, downloaded_bytes: int) -> dict:
    """What a clone or push says of a base: its URL, its size, and the bytes of it fetched
    from the Hub (the rest was in the huggingface_hub cache, or is a directory of this
    machine); a push uploads none of it."""
    return {"url": base.url, "logical_bytes": logical_bytes, "downloaded_bytes": downloaded_bytes,
            "source": "directory" if not base.is_hub else "hub" if downloaded_bytes else "hub cache"}
