"""``wvc ui REMOTE_URL``: a lazy clone of the remote kept in the cache, read through the
same verified paths as any lazy clone: commits and trees come at once, chunks only as the
views need them (the clone checks out its branch's tip, which the views need anyway)."""

from __future__ import annotations

from .. import ids
from ..api import Repo, clone
from ..cache import cache_root
from ..progress import NULL


def local_copy(url: str, progress=NULL) -> Repo:
    target = cache_root() / "ui" / ids.digest(ids.CHUNK, url.encode())[:24]
    if (target / ".wvc").is_dir():
        repo = Repo.open(target)
        repo.fetch("origin", progress=progress)
        return repo
    target.parent.mkdir(parents=True, exist_ok=True)
    return clone(url, target, lazy=True, progress=progress)
