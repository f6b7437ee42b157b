"""``wvc ui REMOTE_URL``: a lazy clone of the remote kept in the cache, read through the
same verified paths as any lazy clone: commits and trees come at once, chunks only as the
views need them (the clone checks out its branch's tip, which the views need anyway)."""

from __future__ import annotations

from .. import ids
from ..api import Repo, clone
from ..read.cache import cache_root
from ..progress import NULL


def local_copy(url: str, progress=NULL) -> Repo:
    target = cache_root() / "ui" / ids.cache_name(url, 24)
    if (target / ".wvc").is_dir():
        repo = Repo.open(target)
        repo.fetch("origin", progress=progress)
        _follow_remote(repo, progress)
        return repo
    target.parent.mkdir(parents=True, exist_ok=True)
    return clone(url, target, lazy=True, progress=progress)


def _follow_remote(repo: Repo, progress=NULL) -> None:
    """Move the copy's branches to the remote's as just fetched: the views show local branches
    and HEAD, and a copy kept from an earlier start would show the remote as it was then
    (issue 49). Nothing here is the user's own work: the copy is a cache."""
    head = repo.head_branch()
    for name, commit in repo.remote_branches().items():
        remote, _, branch = name.partition("/")
        if remote != "origin" or not branch:
            continue
        if branch == head:
            if repo.head() != commit:
                repo.reset(commit, mode="hard", progress=progress)
        elif repo.branches().get(branch) != commit:
            repo.force_branch(branch, commit)
