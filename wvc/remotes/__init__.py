"""Remotes: where repositories meet. One interface (``base.Remote``), two backends:
a directory (``path``: a shared disk or NFS team folder) and a Hugging Face Hub model repo
(``hub``). ``wvc.ops.sync`` implements push, fetch, pull and clone on top of it."""

from __future__ import annotations

from ..errors import WvcError


def open_remote(url: str):
    """The backend for ``url``: ``hf://user/repo`` or a local path / ``file://`` URL."""
    if url.startswith("hf://"):
        from .hub import HubRemote

        return HubRemote.from_url(url)
    if url.startswith("file://"):
        url = url[len("file://"):]
    if "://" in url:
        raise WvcError(f"unsupported remote URL {url!r}: use hf://user/repo, a path or file:///path")
    from .path import PathRemote

    return PathRemote(url)
