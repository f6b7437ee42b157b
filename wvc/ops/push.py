"""Push: objects the remote lacks (closed over delta bases) go up in one new pack, with the
commits and trees; the branch moves last, by compare-and-swap against the remote state read
at the start. Not a fast-forward: refused unless ``force``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import ids
from ..basemodel.record import base_json
from ..errors import NonFastForward, RevisionNotFound, WvcError
from ..fsutil import sweep_work_dirs, work_dir
from ..progress import NULL, Progress
from ..remotes import compaction
from ..remotes.catalog import Catalog, catalog_name, catalog_path
from ..remotes.interface import BASE_RECORD, pack_path
from ..remotes.transfer import remote_contents
from ..store.chains import resolve_chain
from ..store.packs import PackWriter, pack_filename
from ..store.refs import HEADS, TAGS
from .remote_config import REMOTES, index_cache, open_remote_named
from .remote_base import check_same_base, remote_base


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

    def to_json(self):
        return dict(self.__dict__)


def push(repo, remote_name: str = "origin", branch: str | None = None, *, force: bool = False, tags: bool = False,
         progress: Progress = NULL) -> PushResult:
    """Push ``branch`` (default: HEAD's; a tag name pushes that tag) and, with ``tags``,
    every local tag (``--tags`` alone pushes tags only, as in git)."""
    if branch is None and not tags:
        branch = repo.refs.head_branch()
        if branch is None:
            raise WvcError("HEAD is detached: name the branch to push")
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
    remote = open_remote_named(repo, remote_name)
    state = remote.state(create=True)
    ours, theirs = repo.base(), remote_base(state, remote.url)
    check_same_base(remote_name, theirs, ours)
    graph = repo.graph
    primary = next(iter(updates), None)
    name = (primary or "").partition("refs/")[2].partition("/")[2] or (branch or "tags")
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
    if not updates:
        return PushResult(remote_name, name, old, local or "", 0, 0, 0, False, logical)
    contents = remote_contents(remote, state, index_cache(repo))
    # Commits the remote has: its catalogs list them, so the walk from our tip stops at the
    # first one (not walking the whole history every push). A format-1 remote lists none:
    # there, everything its refs reach.
    live = contents.live_segments  # what is in retired segments only is sent again
    known = {c for seg in live for c in seg.commits} | set(state.refs.values())
    if not contents.commits:
        known |= set(graph.ancestors([t for t in state.refs.values() if graph.has_commit(t)]))
    new_commits = graph.ancestors(list(updates.values()), stop=known)

    remote_objects = {e.id for seg in live for e in seg.entries}
    # a lazy clone pushing to another remote fetches what it lacks first, delta bases included
    chunks_of = {cid: repo.read_tree(repo.read_commit(cid).tree).chunk_ids() for cid in new_commits}
    repo.store.ensure_local(set().union(*chunks_of.values()) - remote_objects, progress)
    wanted = _objects_to_send(repo, chunks_of, remote_objects)
    sweep_work_dirs(repo.wvc_dir)  # a killed push's pack
    with work_dir(repo.wvc_dir, "push") as tmp:
        pack_file, catalog = _new_segment(repo, wanted, new_commits, Path(tmp), progress)
        # nothing new to store (a tag on a commit the remote has): refs only, no empty segment
        nothing = pack_file is None and not catalog.commits
        merging = [] if nothing else compaction.to_merge(live, catalog.size)
        retired: list[str] = []
        if merging:  # keep the remote's file count bounded (remotes/compaction.py)
            progress.start(len(merging), "compacting the remote", unit="segments")
            pack_file, catalog = compaction.merge_segments(remote, merging, pack_file, catalog, Path(tmp))
            retired = [f for seg in merging for f in seg.files()]
            progress.close()
        files: dict[str, Path | bytes] = {}
        if pack_file is not None:
            files[pack_path(catalog.pack)] = pack_file
        if not nothing:
            data = catalog.to_bytes()
            files[catalog_path(catalog_name(data))] = data
        if ours is not None and theirs is None:
            files[BASE_RECORD] = base_json(ours)
        delete: tuple[str, ...] = ()
        if retired and remote.deletes_atomically:
            delete = tuple(retired)
        elif retired:
            path, record = compaction.retired_record(retired)
            files[path] = record
        remote.publish(files, dict(updates), state, f"wvc push {name} {ids.short(local or next(iter(updates.values())))}",
                       delete=delete, progress=progress)
    if not remote.deletes_atomically and state.retired:
        compaction.purge(remote, state, contents)  # files retired long enough ago
    with repo.db.write():
        for ref, target in updates.items():
            if ref.startswith(HEADS):
                tracking = f"{REMOTES}{remote_name}/{ref[len(HEADS):]}"
                repo.refs.set(tracking, target, repo.refs.get(tracking), f"push to {remote_name}")
    forced = any(state.refs.get(r) is not None and not graph.is_ancestor(state.refs[r], t) for r, t in updates.items())
    return PushResult(remote_name, name, old, local or "", len(new_commits), len(wanted), remote.bytes_uploaded,
                      force and forced, logical, len(retired), sorted(r for r in updates if r.startswith(TAGS)))


def delete_remote_ref(repo, remote_name: str, name: str) -> dict:
    """Delete branch (or tag) ``name`` on the remote (`push --delete`, `push origin :name`):
    one compare-and-swap that moves only that ref; what it alone held is freed by a later
    `gc --remote`. The remote-tracking ref goes too."""
    remote = open_remote_named(repo, remote_name)
    state = remote.state()
    ref = next((p + name for p in (HEADS, TAGS) if p + name in state.refs), None)
    if ref is None:
        raise RevisionNotFound(f"{remote_name} has no branch or tag {name!r}")
    old = state.refs[ref]
    remote.publish({}, {ref: None}, state, f"wvc push --delete {name}")
    with repo.db.write():
        tracking = f"{REMOTES}{remote_name}/{name}"
        if ref.startswith(HEADS) and repo.refs.get(tracking) is not None:
            repo.refs.delete(tracking, f"push --delete to {remote_name}")
    return {"remote": remote_name, "deleted": ref, "was": old}


def _new_segment(repo, wanted: list[str], new_commits: list[str], tmp: Path, progress: Progress):
    """This push's pack (None when every chunk is on the remote already) and its catalog:
    the pack's index and the new commits and trees."""
    catalog = Catalog(None)
    for cid in new_commits:
        commit = repo.read_commit(cid)
        catalog.commits[cid] = commit.to_bytes()
        catalog.trees[commit.tree] = repo.graph.tree_bytes(commit.tree)
    if not wanted:
        return None, catalog
    writer = PackWriter(tmp)
    rows = [repo.store.row(oid) for oid in wanted]
    progress.start(sum(r.length for r in rows), "packing")
    for row in rows:
        writer.add(row.id, repo.store.reader.read(row.pack, row.offset, row.length), row.raw_size, row.method, row.base)
        progress.advance(row.length)
    progress.close()
    name, _ = writer.finish()
    catalog.pack, catalog.entries = name, list(writer.entries)
    return tmp / pack_filename(name), catalog


def _objects_to_send(repo, chunks_of: dict[str, set[str]], remote_objects: set[str]) -> list[str]:
    """Chunks of the new commits' trees (``chunks_of``, by commit) that the remote lacks, each
    followed by the delta bases it needs (store/chains.py); never a base model's chunk: the
    other side reads those from the base itself."""
    wanted: list[str] = []
    seen = set(remote_objects)
    for chunks in chunks_of.values():
        for chunk in sorted(chunks - seen):
            for link in resolve_chain(chunk, repo.store.row, stop=seen.__contains__, max_links=repo.store.max_links):
                if link.external:
                    break
                seen.add(link.id)
                wanted.append(link.id)
    return wanted
