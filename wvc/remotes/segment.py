"""What a push's segment holds: the chunks the remote lacks, closed over their delta bases
(payloads copied verbatim from the local packs into one new pack), and its catalog: the new
commits, and their trees whole or as tree deltas (``docs/remotes.md``, "When a push stores a
tree delta"). The verb (``ops/push.py``) says which commits and refs go; the remote repository
publishes the segment (``RemoteRepository.push_segment``)."""

from __future__ import annotations

from pathlib import Path

from ..model import tree_diff
from ..progress import Progress
from ..store.chains import resolve_chain
from ..store.packs import PackWriter, copy_payloads, pack_filename
from .catalog import Catalog


def objects_to_send(store, chunks_of: dict[str, set[str]], remote_objects: set[str]) -> list[str]:
    """Chunks of the new commits' trees (``chunks_of``, by commit) that the remote lacks, each
    followed by the delta bases it needs (store/chains.py); never a base model's chunk: the
    other side reads those from the base itself."""
    wanted: list[str] = []
    seen = set(remote_objects)
    for chunks in chunks_of.values():
        for chunk in sorted(chunks - seen):
            for link in resolve_chain(chunk, store.row, stop=seen.__contains__, max_links=store.max_links):
                if link.external:
                    break
                seen.add(link.id)
                wanted.append(link.id)
    return wanted


def stored_trees(graph, live_segments, new_commits: list[str]) -> dict[str, bytes]:
    """The new commits' trees as the catalog stores them: a tree delta of the first parent's
    tree (model/tree_diff.py) where the remote or this push holds that tree, only chunk ids
    changed, the chain stays within MAX_DELTA_DEPTH and its deltas together stay smaller
    than the whole tree; else the whole tree. A step of a 250,000-chunk model that changes
    1% of its chunks then sends 2,500 ids, not 250,000 (docs/remotes.md, "When a push stores a
    tree delta"). ``live_segments``: the remote's (a tree only a retired segment holds goes
    when the segment does). A tree the remote holds already is not stored again."""
    out: dict[str, bytes] = {}
    held: dict[str, bytes] = {}
    for seg in live_segments:
        tree_diff.merge_forms(held, seg.trees)
    # A remote an older wvc wrote may hold a tree only as deltas that loop back to it (a
    # version pushed again was stored again, as a delta of its child's tree): this push
    # repairs it with the whole tree wherever this repository has it (readers prefer a
    # whole form: tree_diff.merge_forms).
    for tid in sorted(tree_diff.looping(held)):
        if graph.has_tree(tid):
            out[tid] = graph.tree_bytes(tid)

    def stored(tid: str) -> bytes | None:
        return out.get(tid) or held.get(tid)

    def head(tid: str):
        data = stored(tid)
        return None if data is None else (len(data), data[: tree_diff.HEAD_BYTES])

    for cid in graph.in_insertion_order(new_commits):  # (a parent before its children)
        commit = graph.read_commit(cid)
        if commit.tree in out or commit.tree in held:
            # stored once only: the remote's form of a tree seen before (a revert, a restart
            # from the start directory) is what every reader resolves; storing it again as a
            # delta of its parent's tree would make its chain loop back to itself
            continue
        whole = out[commit.tree] = graph.tree_bytes(commit.tree)
        parent = commit.parents[0] if commit.parents and graph.has_commit(commit.parents[0]) else None
        parent_tree = graph.read_commit(parent).tree if parent is not None else None
        if (parent_tree is None or parent_tree == commit.tree or stored(parent_tree) is None
                or not graph.has_tree(parent_tree)):
            continue
        depth, size = tree_diff.chain(parent_tree, head)
        if depth >= tree_diff.MAX_DELTA_DEPTH:
            continue
        delta = graph.stored_tree(commit.tree)  # (the commit stored this delta already, unless its chain was full)
        if not (tree_diff.is_delta(delta) and tree_diff.base_of(delta, commit.tree) == parent_tree):
            changes = tree_diff.diff_trees(graph.read_tree(parent_tree), graph.read_tree(commit.tree))
            delta = None if changes is None else tree_diff.encode_delta(parent_tree, changes)
        if delta is not None and size + len(delta) < len(whole):
            out[commit.tree] = delta
    return out


def new_segment(store, graph, live_segments, wanted: list[str], new_commits: list[str], tmp: Path,
                progress: Progress):
    """This push's pack (None when every chunk is on the remote already) and its catalog:
    the pack's index and the new commits and trees. ``wanted``: the chunks to send
    (:func:`objects_to_send`)."""
    catalog = Catalog(None, trees=stored_trees(graph, live_segments, new_commits))
    for cid in new_commits:
        catalog.commits[cid] = graph.read_commit(cid).to_bytes()
    if not wanted:
        return None, catalog
    rows = [store.row(oid) for oid in wanted]
    progress.start(sum(r.length for r in rows), "packing")
    path, name, entries = pack_of(store, rows, tmp, progress)
    progress.close()
    return path, Catalog(name, entries, catalog.commits, catalog.trees)


def pack_of(store, rows, tmp: Path, progress: Progress | None = None) -> tuple[Path, str, list]:
    """The local payloads of ``rows`` (the store's, non-empty), copied verbatim into one new
    pack in ``tmp``: (its path, its name, its entries)."""
    writer = PackWriter(tmp)
    try:
        entries = copy_payloads(writer, ((r, store.reader.read(r.pack, r.offset, r.length)) for r in rows), progress)
        name, _ = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return tmp / pack_filename(name), name, entries
