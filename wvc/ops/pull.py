"""Pull: fetch, then fast-forward the branch (checking it out when it is HEAD's), or with
``rebase`` replay the local-only commits on top of the remote's."""

from __future__ import annotations

from .. import ids
from ..errors import NonFastForward, RevisionNotFound, WvcError
from ..objects import Commit
from ..progress import NULL, Progress
from ..store.refs import HEADS
from .checkout import checkout
from .fetch import fetch
from .remote_config import REMOTES


def pull(repo, remote_name: str = "origin", branch: str | None = None, *, rebase: bool = False,
         merge: bool = False, strategy: str | None = None, progress: Progress = NULL) -> dict:
    fetched = fetch(repo, remote_name, progress=progress)
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise WvcError("HEAD is detached: name the branch to pull")
    upstream = repo.refs.get(f"{REMOTES}{remote_name}/{branch}")
    if upstream is None:
        raise RevisionNotFound(f"remote {remote_name} has no branch {branch!r}")
    local = repo.refs.get(HEADS + branch)
    graph = repo.graph
    result = {"remote": remote_name, "branch": branch, "old": local, "new": upstream,
              "downloaded_bytes": fetched.downloaded_bytes, "fast_forward": True}
    if local == upstream or (local is not None and graph.is_ancestor(upstream, local)):
        result["new"] = local
        return result  # up to date, or ahead
    if local is not None and not graph.is_ancestor(local, upstream):
        if merge and repo.refs.head_branch() == branch:
            from .merge import merge as merge_into_head

            done = merge_into_head(repo, f"{REMOTES}{remote_name}/{branch}", strategy=strategy, progress=progress,
                                   message=f"Merge {remote_name}/{branch} into {branch}")
            result.update(new=done.commit, fast_forward=False, merged=True, merge=done.to_json())
            return result
        if not rebase:
            raise NonFastForward(
                f"branches diverged: local {branch} ({ids.short(local)}) and {remote_name}/{branch} "
                f"({ids.short(upstream)}) each have commits the other lacks; `wvc pull --rebase` replays "
                f"your commits on top of {remote_name}/{branch}, `wvc pull --merge [--strategy S]` merges them"
            )
        new_tip = replay(repo, local, upstream)
        result.update(new=new_tip, fast_forward=False, rebased=True)
        with repo.db.write():  # the new tip has the local tip's tree: the working tree stays as is
            repo.refs.set(HEADS + branch, new_tip, local, f"pull --rebase onto {remote_name}/{branch}")
        return result
    if repo.refs.head_branch() == branch:
        checkout(repo, upstream, progress=progress)  # refuses to overwrite local work
        with repo.db.write():
            repo.refs.set(HEADS + branch, upstream, local, f"pull: fast-forward from {remote_name}")
            repo.refs.set_head("ref: " + HEADS + branch, f"pull: back on {branch}")
    else:
        with repo.db.write():
            repo.refs.set(HEADS + branch, upstream, local, f"pull: fast-forward from {remote_name}")
    return result


def replay(repo, local: str, upstream: str) -> str:
    """Re-create the local-only commits (oldest first) on top of ``upstream``.

    A commit is a full snapshot, so replaying one keeps its tree, message, author and
    metadata and only changes its parent: no chunk is re-encoded, nothing is merged. The
    replayed commit keeps the stored bytes of the one it replays (the same objects).
    """
    graph = repo.graph
    mine = graph.in_insertion_order(graph.ancestors(local, stop=set(graph.ancestors(upstream))))
    parent = upstream
    with repo.db.write():
        for cid in mine:
            old = repo.read_commit(cid)
            new = Commit(old.tree, (parent,), old.author, old.timestamp, old.message, old.metadata)
            graph.add_commit(new, graph.stored_bytes(cid))
            parent = new.id
    return parent
