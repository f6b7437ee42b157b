"""Pull: fetch, then fast-forward the branch (checking it out when it is HEAD's), or with
``rebase`` replay the local-only commits' changes on top of the remote's. Holds the
working-tree lock from the fetch's end to the branch's move."""

from __future__ import annotations

from .. import ids
from ..errors import DetachedHead, NonFastForward, RevisionNotFound
from ..model.versions import Commit, Tree
from ..progress import NULL, Progress
from ..store.refs import HEADS
from .checkout import switch_worktree
from .fetch import fetch
from .remote_config import REMOTES


def pull(repo, remote_name: str = "origin", branch: str | None = None, *, rebase: bool = False,
         merge: bool = False, strategy: str | None = None, progress: Progress = NULL, fetched=None) -> dict:
    """``fetched``: the FetchResult of a fetch the caller just made (a clone): not fetched again."""
    fetched = fetched or fetch(repo, remote_name, progress=progress)
    branch = branch or repo.refs.head_branch()
    if branch is None:
        raise DetachedHead("HEAD is detached: name the branch to pull")
    with repo.worktree_lock("pull"):
        return _integrate(repo, remote_name, branch, fetched, rebase, merge, strategy, progress)


def _integrate(repo, remote_name, branch, fetched, rebase, merge, strategy, progress) -> dict:
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
    on_head = repo.refs.head_branch() == branch
    if local is not None and not graph.is_ancestor(local, upstream):
        if merge and on_head:
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
        new_tip, replayed = replay(repo, local, upstream)
        result.update(new=new_tip, fast_forward=False, rebased=replayed, onto=upstream)
        if on_head:  # the working tree holds the local tip; upstream's changes come in now
            switch_worktree(repo, repo.tree_of(local), repo.tree_of(new_tip), progress=progress)
        with repo.db.write():
            repo.refs.set(HEADS + branch, new_tip, local, f"pull --rebase onto {remote_name}/{branch}")
        return result
    if on_head:
        with repo.worktree_lock("pull"):  # refuses to overwrite local work; HEAD is never detached on the way
            switch_worktree(repo, repo.tree_of(local) if local else None, repo.tree_of(upstream), progress=progress)
            with repo.db.write():
                repo.refs.set(HEADS + branch, upstream, local, f"pull: fast-forward from {remote_name}")
    else:
        with repo.db.write():
            repo.refs.set(HEADS + branch, upstream, local, f"pull: fast-forward from {remote_name}")
    return result


def replay(repo, local: str, upstream: str) -> tuple[str, int]:
    """Re-apply each local-only commit's changes (oldest first) on top of ``upstream``;
    returns (the new tip, how many commits were replayed).

    Each commit's change against its parent is applied per file and, in a safetensors
    file, per tensor chunk (the merge's three-way plan with the commit's parent as base):
    upstream's changes to other files or tensors stay. A file or tensor both sides changed
    differently is a conflict: MergeConflict lists them and nothing is written. A commit
    whose change upstream already has is dropped. No chunk is re-encoded: the new trees are
    made of chunks both sides already stored.
    """
    from .merge import MergeConflict, plan_three_way

    graph = repo.graph
    mine = graph.in_insertion_order(graph.ancestors(local, stop=set(graph.ancestors(upstream))))
    base_tree = repo.tree_of(upstream)
    parent, replayed, versions = upstream, 0, []
    for cid in mine:
        old = repo.read_commit(cid)
        before = repo.tree_of(old.parents[0]) if old.parents else Tree((), base_tree.chunk_bytes)
        plan = plan_three_way(before, base_tree, repo.tree_of(cid))
        if plan.conflicts:
            shown = ", ".join(plan.conflicts[:8]) + (f" and {len(plan.conflicts) - 8} more" if len(plan.conflicts) > 8 else "")
            raise MergeConflict(f"pull --rebase refused, nothing changed: your commit {ids.short(cid)} "
                                f"({old.summary}) and upstream both changed {shown}; "
                                "`wvc pull --merge --strategy S` settles conflicts", plan.conflicts)
        tree = Tree(tuple(plan.files[p] for p in sorted(plan.files)), base_tree.chunk_bytes)
        if tree.id == base_tree.id:
            continue  # upstream has this change already
        new = Commit(tree.id, (parent,), old.author, old.timestamp, old.message, old.metadata)
        versions.append((new, tree, graph.stored_bytes(cid)))
        parent, base_tree, replayed = new.id, tree, replayed + 1
    repo.record(versions)  # the branch moves after the working tree (pull's _integrate)
    return parent, replayed
