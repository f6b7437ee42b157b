"""Push: objects the remote lacks (closed over delta bases) go up in one new pack, with the
commits and trees; the branch moves last, by compare-and-swap against the remote state read
at the start. Not a fast-forward: refused unless ``force``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import ids
from ..basemodel.base_ref import base_json
from ..errors import DetachedHead, NonFastForward, RevisionNotFound, VersionPruned
from ..fsutil import sweep_work_dirs, work_dir
from ..progress import NULL, Progress
from ..store.refs import HEADS, REFS, TAGS
from ..remotes import segment, step_record_writer
from .remote_config import REMOTES, open_remote_repository
from ..basemodel.remote import base_report, check_same_base, remote_base


@dataclass
class PushResult:
    remote: str
    branch: str
    old: str | None
    new: str
    commits: int
    objects: int
    uploaded_bytes: int
    forced: bool
    logical_bytes: int = 0  # size of the pushed version's files: what a full upload would send
    files_replaced: int = 0  # remote files this push's compaction replaced
    tags: list[str] = field(default_factory=list)  # tag refs this push created or moved
    copied_bytes: int = 0  # server-side copies its compaction made instead of uploading (Backend.compose)
    base: dict | None = None  # the base the pushed history starts from: never uploaded (basemodel.remote.base_report)

    def to_json(self):
        return dict(self.__dict__)


def push(repo, remote_name: str = "origin", branch: str | None = None, *, force: bool = False, tags: bool = False,
         progress: Progress = NULL) -> PushResult:
    """Push ``branch`` (default: HEAD's; a tag name pushes that tag) and, with ``tags``,
    every local tag (``--tags`` alone pushes tags only, as in git)."""
    if branch is None and not tags:
        branch = repo.refs.head_branch()
        if branch is None:
            raise DetachedHead("HEAD is detached: name the branch to push")
    updates: dict[str, str] = {}  # remote ref -> local commit
    if branch is not None:
        for prefix in (HEADS, TAGS):
            if (target := repo.refs.get(prefix + branch)) is not None:
                updates[prefix + branch] = target
                break
        else:
            raise RevisionNotFound(f"no local branch or tag {branch!r}")
    if tags:
        updates.update({TAGS + name: target for name, target in repo.refs.list(TAGS).items()})
    remote = open_remote_repository(repo, remote_name, create=True)
    state = remote.state
    ours, theirs = repo.base(), remote_base(remote.base_record, remote.url)
    check_same_base(remote_name, theirs, ours)
    graph = repo.graph
    primary = next(iter(updates), None)
    name = (primary or "").partition(REFS)[2].partition("/")[2] or (branch or "tags")
    local = updates.get(primary) if primary else None
    logical = repo.read_tree(repo.read_commit(local).tree).logical_bytes if local else 0
    old = state.refs.get(primary) if primary else None
    for ref, target in list(updates.items()):
        there = state.refs.get(ref)
        if there == target:
            del updates[ref]
        elif there is not None and not force and ref.startswith(TAGS):
            raise NonFastForward(f"tag {ref[len(TAGS):]} is at {ids.short(there)} on {remote_name}, at "
                                 f"{ids.short(target)} here: a tag does not move (push --force moves it)")
        elif there is not None and not force and not (graph.has_commit(there) and graph.is_ancestor(there, target)):
            raise NonFastForward(
                f"push to {remote_name}/{ref[len(HEADS):]} rejected: the remote has commits you do not have "
                f"(not a fast-forward); run `wvc pull {remote_name} {ref[len(HEADS):]}` first, or push --force"
            )
    base = None
    if ours is not None:
        base = base_report(ours, repo.read_tree(ours.tree).logical_bytes, 0)
    if not updates:
        return PushResult(remote_name, name, old, local or "", 0, 0, 0, False, logical, base=base)
    contents = remote.contents
    # Commits the remote has: its catalogs list them, so the walk from our tip stops at the
    # first one (not walking the whole history every push). A format-1 remote lists none:
    # there, everything its refs reach.
    live = contents.live_segments  # what is in retired segments only is sent again
    known = set().union(*(seg.commits.keys() for seg in live)) | set(state.refs.values())
    if not contents.commits:
        known |= set(graph.ancestors([t for t in state.refs.values() if graph.has_commit(t)]))
    new_commits = graph.ancestors(list(updates.values()), stop=known)

    pruned = repo.graph.pruned().intersection(new_commits)
    if pruned:
        raise VersionPruned(f"{len(pruned)} of the {len(new_commits)} commits {remote_name} lacks were pruned here "
                            f"(wvc prune), e.g. {ids.short(next(iter(pruned)))}: their weights cannot be sent")
    remote_objects = set().union(*(seg.ids for seg in live))
    # a lazy clone pushing to another remote fetches what it lacks first, delta bases included
    chunks_of = {cid: repo.read_tree(repo.read_commit(cid).tree).chunk_ids() for cid in new_commits}
    # a ref moved onto a version the remote pruned: its weights go up again (the remote
    # counts a ref's commit as kept, remotes/repository.RemoteRepository.pruned)
    for target in set(updates.values()) & contents.pruned:
        if target is not None and not repo.graph.is_pruned(target):
            chunks_of[target] = repo.read_tree(repo.read_commit(target).tree).chunk_ids()
    repo.store.ensure_local(set().union(*chunks_of.values()) - remote_objects, progress)
    wanted = segment.objects_to_send(repo.store, chunks_of, remote_objects)
    sweep_work_dirs(repo.wvc_dir)  # a killed push's pack
    with work_dir(repo.wvc_dir, "push") as tmp:
        pack_file, catalog = segment.new_segment(repo.store, graph, live, wanted, new_commits, Path(tmp), progress)
        tip = updates.get(primary) if primary is not None and primary.startswith(HEADS) else None

        others = [t for r, t in state.refs.items() if r.startswith(HEADS) and r != primary]
        replaced = remote.push_segment(
            pack_file, catalog, dict(updates), f"wvc push {name} {ids.short(local or next(iter(updates.values())))}",
            Path(tmp), base_record=base_json(ours) if ours is not None else None, progress=progress,
            step_records=step_record_writer.for_push(repo, tip, new_commits, others) if tip is not None else None)
    with repo.db.write():
        for ref, target in updates.items():
            if ref.startswith(HEADS):
                tracking = f"{REMOTES}{remote_name}/{ref[len(HEADS):]}"
                repo.refs.set(tracking, target, repo.refs.get(tracking), f"push to {remote_name}")
    forced = any(state.refs.get(r) is not None and not graph.is_ancestor(state.refs[r], t) for r, t in updates.items())
    return PushResult(remote_name, name, old, local or "", len(new_commits), len(wanted),
                      remote.uploaded_bytes, force and forced, logical, replaced,
                      sorted(r for r in updates if r.startswith(TAGS)), remote.copied_bytes, base)


def delete_remote_ref(repo, remote_name: str, name: str) -> dict:
    """Delete branch (or tag) ``name`` on the remote (`push --delete`, `push origin :name`):
    one compare-and-swap that moves only that ref; what it alone held is freed by a later
    `gc --remote`. The remote-tracking ref goes too."""
    remote = open_remote_repository(repo, remote_name)
    ref = next((p + name for p in (HEADS, TAGS) if p + name in remote.refs), None)
    if ref is None:
        raise RevisionNotFound(f"{remote_name} has no branch or tag {name!r}")
    old = remote.refs[ref]
    remote.publish({}, {ref: None}, f"wvc push --delete {name}")
    with repo.db.write():
        tracking = f"{REMOTES}{remote_name}/{name}"
        if ref.startswith(HEADS) and repo.refs.get(tracking) is not None:
            repo.refs.delete(tracking, f"push --delete to {remote_name}")
    return {"remote": remote_name, "deleted": ref, "was": old}
