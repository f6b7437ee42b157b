"""Merge: three-way, per tensor (per chunk where a tensor is chunked), against the merge-base.

Plan first, write nothing: for every path and, in a safetensors file both sides changed,
every tensor chunk: unchanged on one side -> the other side's, bit for bit; the same change
on both -> it; different changes -> a conflict. With no strategy any conflict refuses the
merge and nothing changes. A strategy resolves conflicting tensors (``ours``/``theirs``
also whole files); computed tensors (model/merge_methods.py) are encoded as new chunks, deltas
against our side's. Then the merge commit (two parents, the recipe in its metadata) is
recorded, the working tree is switched to it like a checkout, and the branch moves last,
by compare-and-swap. ``no_commit`` writes the result into the working tree instead and
remembers the other parent for the next ``wvc commit``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .. import ids
from ..codec.devices import resolve_device
from ..errors import InvalidArgument, MergeInProgress, NothingToCommit, UncommittedChanges, WvcError
from ..formats.dtypes import DTYPES
from ..model.merge_methods import COMPUTED, TAKE_SIDE, MergeParameters, merge_tensor
from ..model.chunk_spans import chunk_spans
from ..model.versions import Commit, FileEntry, TensorEntry, Tree
from ..progress import NULL, Progress
from ..store.config_keys import MERGE_HEAD, MERGE_RECIPE
from ..store.refs import HEADS
from .checkout import switch_worktree
from .commit import default_author
from ..worktree.materialize import write_file
from .status import status

FLOAT_KINDS = ("float",)


class MergeConflict(WvcError):
    """Both sides changed the same tensor or file differently, and no strategy resolves it."""

    def __init__(self, message: str, conflicts: list[str]):
        super().__init__(message)
        self.conflicts = conflicts


@dataclass
class MergeResult:
    status: str  # "up-to-date" | "fast-forward" | "merged" | "written"
    ours: str
    theirs: str
    commit: str | None = None
    merge_base: str | None = None
    merge_bases: list[str] = field(default_factory=list)
    strategy: str | None = None
    computed: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)  # conflicts a strategy settled by taking a side
    from_theirs: list[str] = field(default_factory=list)  # clean changes taken from their side
    stored_bytes: int = 0

    def to_json(self):
        return dict(self.__dict__)


@dataclass
class _Plan:
    files: dict[str, FileEntry]  # the result's files (computed tensors still to be filled in)
    computed: list[tuple[str, str]] = field(default_factory=list)  # (path, tensor name)
    conflicts: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    from_theirs: list[str] = field(default_factory=list)


def merge(repo, rev: str, *, strategy: str | None = None, params: MergeParameters | None = None,
          no_commit: bool = False, message: str | None = None, author: str | None = None,
          device: str = "auto", progress: Progress = NULL) -> MergeResult:
    with repo.worktree_lock("merge"):
        return _merge(repo, rev, strategy=strategy, params=params, no_commit=no_commit, message=message,
                      author=author, device=device, progress=progress)


def _merge(repo, rev, *, strategy, params, no_commit, message, author, device, progress) -> MergeResult:
    params = params or MergeParameters()
    if strategy is not None:
        params.check(strategy)
    ours = repo.refs.head_commit()
    if ours is None:
        raise NothingToCommit("nothing to merge into: HEAD has no commits yet")
    theirs = repo.resolve(rev)
    graph = repo.graph
    if graph.is_ancestor(theirs, ours):
        return MergeResult("up-to-date", ours, theirs, ours)
    if repo.db.get_config(MERGE_HEAD) is not None:
        raise MergeInProgress("a merge written with --no-commit is waiting: `wvc commit` it, or "
                       "`wvc checkout --force HEAD` to drop it")
    if not status(repo).clean:
        raise UncommittedChanges("merge needs a clean working tree: commit or discard your changes first")
    if graph.is_ancestor(ours, theirs):
        return _fast_forward(repo, ours, theirs, progress)

    merge_bases = graph.merge_bases(ours, theirs)
    merge_base = merge_bases[0] if merge_bases else None
    o_tree, t_tree = repo.tree_of(ours), repo.tree_of(theirs)
    b_tree = repo.tree_of(merge_base) if merge_base else Tree((), o_tree.chunk_bytes)
    if not (o_tree.chunk_bytes == t_tree.chunk_bytes == (b_tree.chunk_bytes if merge_base else o_tree.chunk_bytes)):
        raise InvalidArgument("the two sides (or their merge-base) are chunked with different chunk sizes: "
                       "a per-tensor merge needs one")
    plan = _plan(b_tree, o_tree, t_tree, strategy, params)
    if plan.conflicts:
        shown = ", ".join(plan.conflicts[:8]) + (f" and {len(plan.conflicts) - 8} more" if len(plan.conflicts) > 8 else "")
        hint = ("pick a --strategy (ours, theirs, linear, task-arithmetic, ties, dare-linear, dare-ties, slerp)"
                if strategy is None else f"--strategy {strategy} cannot settle these (see docs/merge.md)")
        raise MergeConflict(f"merge of {rev} refused, nothing changed: {len(plan.conflicts)} conflict{'' if len(plan.conflicts) == 1 else 's'}: {shown}; {hint}",
                            plan.conflicts)

    recipe = {"strategy": strategy, "parameters": params.to_json(strategy) if strategy else {},
              "merge_base": merge_base, "merge_bases": merge_bases, "computed": [f"{p}:{n}" for p, n in plan.computed]}
    with repo.store.writer(device=resolve_device(device), max_chain=repo.max_chain) as writer:
        files = _fill_computed(repo, plan, b_tree, o_tree, t_tree, strategy, params, writer, progress)
        pack, rows = writer.finish()
    tree = Tree(tuple(files[p] for p in sorted(files)), o_tree.chunk_bytes)
    result = MergeResult("merged", ours, theirs, None, merge_base, merge_bases, strategy, recipe["computed"], plan.resolved,
                         plan.from_theirs, writer.stored_bytes)
    if no_commit:
        with repo.db.write():
            repo.store.insert_rows(pack, rows)
        _write_working_tree(repo, o_tree, tree, progress)
        with repo.db.write():
            repo.db.set_config(MERGE_HEAD, theirs)
            repo.db.set_config(MERGE_RECIPE, json.dumps(recipe, sort_keys=True))
        result.status = "written"
        return result

    summary = message or f"Merge {rev} into {repo.refs.head_branch() or ids.short(ours)}"
    new = Commit(tree.id, (ours, theirs), author or default_author(), int(time.time()), summary, {"merge": recipe})
    repo.record([(new, tree, writer.stored_bytes)], packs=[(pack, rows)])  # the branch moves with the tree:
    _move_to(repo, ours, new.id, f"merge {rev}: {summary}", progress)
    result.commit = new.id
    return result


def _fast_forward(repo, ours: str, theirs: str, progress: Progress) -> MergeResult:
    _move_to(repo, ours, theirs, "merge: fast-forward", progress)
    return MergeResult("fast-forward", ours, theirs, theirs)


def _move_to(repo, old: str, new: str, reason: str, progress: Progress) -> None:
    """Switch the working tree to ``new``, then move HEAD's branch from ``old`` (CAS)."""
    branch = repo.refs.head_branch()
    with repo.worktree_lock("merge"):  # the tree was clean: this only writes what changes
        switch_worktree(repo, repo.tree_of(old), repo.tree_of(new), progress=progress)
        # HEAD is never detached on the way: its reflog gets one entry, old -> new, so
        # HEAD@{1} is the commit before the merge (what `reset --hard HEAD@{1}` undoes to)
        with repo.db.write():
            if branch is None:
                repo.refs.set_head(new, reason)
                return
            repo.refs.set(HEADS + branch, new, old, reason)  # CAS: a branch moved meanwhile is a ConcurrentUpdate


# -- planning ---------------------------------------------------------------------------------
def plan_three_way(b_tree: Tree, o_tree: Tree, t_tree: Tree) -> _Plan:
    """The plain three-way plan (no strategy): ``plan.files`` is the result where
    ``plan.conflicts`` is empty. pull --rebase replays a commit with it."""
    if not o_tree.chunk_bytes == t_tree.chunk_bytes == (b_tree.chunk_bytes if b_tree.files else o_tree.chunk_bytes):
        raise InvalidArgument("the two sides are chunked with different chunk sizes: a per-tensor merge needs one")
    return _plan(b_tree, o_tree, t_tree, None, MergeParameters())


def _plan(b_tree: Tree, o_tree: Tree, t_tree: Tree, strategy: str | None, params: MergeParameters) -> _Plan:
    b, o, t = b_tree.by_path(), o_tree.by_path(), t_tree.by_path()
    plan = _Plan({})
    for path in sorted(set(b) | set(o) | set(t)):
        fb, fo, ft = b.get(path), o.get(path), t.get(path)
        co, ct, cb = (f.with_content_id().hash if f else None for f in (fo, ft, fb))
        if co == ct or ct == cb:  # the same on both sides, or only ours changed it
            if fo is not None:
                plan.files[path] = fo
        elif co == cb:  # only theirs changed it
            if ft is not None:
                plan.files[path] = ft
            plan.from_theirs.append(path)
        elif fo is not None and ft is not None and fo.kind == ft.kind == "safetensors" \
                and (fb is None or fb.kind == "safetensors"):
            _plan_tensors(path, fb, fo, ft, strategy, plan, o_tree.chunk_bytes)
        elif strategy in TAKE_SIDE:  # added, deleted or changed on both sides, whole files
            chosen = fo if strategy == "ours" else ft
            if chosen is not None:
                plan.files[path] = chosen
            plan.resolved.append(path)
        else:
            plan.conflicts.append(path)
    return plan


def _layout(f: FileEntry) -> list[tuple[str, str, tuple]]:
    return [(x.name, x.dtype, x.shape) for x in f.tensors]


def _plan_tensors(path: str, fb, fo: FileEntry, ft: FileEntry, strategy, plan: _Plan, chunk_bytes: int) -> None:
    """A safetensors file both sides changed: tensor by tensor, chunk by chunk."""
    if _layout(fo) != _layout(ft):  # tensors added, removed, reshaped or retyped
        if strategy in TAKE_SIDE:
            plan.files[path] = fo if strategy == "ours" else ft
            plan.resolved.append(path)
        else:
            plan.conflicts.append(f"{path} (tensor names, shapes or dtypes differ between the sides)")
        return
    base_tensors = {x.name: x for x in fb.tensors} if fb is not None and _layout(fb) == _layout(fo) else {}
    header = _three_way(fb.header if fb else None, fo.header, ft.header)
    if header is None:
        if strategy is None:
            plan.conflicts.append(f"{path} (header metadata)")
            return
        header = ft.header if strategy == "theirs" else fo.header  # computed strategies keep ours
        plan.resolved.append(f"{path}:header")
    merged = []
    for xo, xt in zip(fo.tensors, ft.tensors):
        xb = base_tensors.get(xo.name)
        chunks = _merge_chunks(xb.chunks if xb else None, xo.chunks, xt.chunks)
        name = f"{path}:{xo.name}"
        if chunks is not None:
            if chunks != xo.chunks:
                plan.from_theirs.append(name)
            merged.append(xo if chunks == xo.chunks else TensorEntry(xo.name, xo.dtype, xo.shape, chunks))
        elif strategy in TAKE_SIDE:
            merged.append(xo if strategy == "ours" else xt)
            plan.resolved.append(name)
        elif strategy in COMPUTED and DTYPES[xo.dtype].kind in FLOAT_KINDS \
                and (xb is not None or strategy in ("linear", "slerp")):
            merged.append(TensorEntry(xo.name, xo.dtype, xo.shape, ()))  # filled in by _fill_computed
            plan.computed.append((path, xo.name))
        else:
            why = "" if strategy is None else (" (not a float tensor)" if DTYPES[xo.dtype].kind not in FLOAT_KINDS
                                              else " (no merge-base version to take task vectors from)")
            plan.conflicts.append(name + why)
    size = fo.size if header == fo.header else ft.size  # same tensors: only the header's length may differ
    plan.files[path] = FileEntry.of(path, "safetensors", size, header=header, tensors=tuple(merged),
                                    executable=_three_way(fb.executable if fb else None, fo.executable, ft.executable)
                                    or False)


def _three_way(b, o, t):
    if o == t or t == b:
        return o
    if o == b:
        return t
    return None


def _merge_chunks(b, o, t):
    """The merged chunk list, or None when some chunk changed differently on both sides."""
    if o == t:
        return o
    if b is None or len(b) != len(o):
        return None
    out = []
    for cb, co, ct in zip(b, o, t):
        chosen = _three_way(cb, co, ct)
        if chosen is None:
            return None
        out.append(chosen)
    return tuple(out)


# -- computing and writing ------------------------------------------------------------------------
def _fill_computed(repo, plan: _Plan, b_tree, o_tree, t_tree, strategy, params, writer, progress) -> dict:
    """Compute each conflicting tensor with the strategy and store it as chunks (deltas
    against our side's chunks); returns the result's files with those chunk lists."""
    if not plan.computed:
        return plan.files
    import torch

    from ..read.tensors import stream_tensors

    b, o, t = b_tree.by_path(), o_tree.by_path(), t_tree.by_path()
    files = dict(plan.files)
    wanted = set(plan.computed)
    progress.start(len(wanted), f"merging tensors ({strategy})", unit="tensors")
    for path in sorted({p for p, _ in wanted}):
        entry = files[path]
        sides = {}  # each computed tensor's (base or None, ours, theirs) entries
        for x in entry.tensors:
            if (path, x.name) in wanted:
                sides[x.name] = (next((y for y in b[path].tensors if y.name == x.name), None) if path in b else None,
                                 next(y for y in o[path].tensors if y.name == x.name),
                                 next(y for y in t[path].tensors if y.name == x.name))
        reading = [e for triple in sides.values() for e in triple if e is not None]
        repo.store.ensure_local([c for e in reading for c in e.chunks], progress)
        decoded = stream_tensors(repo.store, reading)  # decoded ahead across the file's tensors, in this order
        tensors = []
        for x in entry.tensors:
            if x.name not in sides:
                tensors.append(x)
                continue
            xb, xo, xt = sides[x.name]
            base = next(decoded) if xb is not None else None
            ours, theirs = next(decoded), next(decoded)
            merged = merge_tensor(strategy, base, ours, theirs, params, x.name)
            raw = merged.contiguous().view(torch.uint8).numpy().tobytes() if merged.numel() else b""
            dtype = DTYPES[x.dtype]
            chunks = []
            for i, (start, end) in enumerate(chunk_spans(len(raw), dtype.width, o_tree.chunk_bytes)):
                delta_base = xo.chunks[i] if i < len(xo.chunks) else None
                chunks.append(writer.put(raw[start:end], dtype, delta_base))
            tensors.append(TensorEntry(x.name, x.dtype, x.shape, tuple(chunks)))
            progress.advance(1)
        files[path] = FileEntry.of(path, "safetensors", entry.size, header=entry.header, tensors=tuple(tensors),
                                   executable=entry.executable)
    progress.close()
    return files


def _write_working_tree(repo, o_tree: Tree, tree: Tree, progress: Progress) -> None:
    """--no-commit: the working tree (clean at ``o_tree``) becomes ``tree``, refs unchanged."""
    from ..fsutil import resolve_inside

    before, after = o_tree.by_path(), tree.by_path()
    changed = [f for p, f in after.items() if p not in before or before[p].with_content_id().hash
               != f.with_content_id().hash]
    progress.start(sum(f.size for f in changed), "writing the merge")
    for f in changed:
        write_file(repo.store, f, resolve_inside(repo.root, f.path), progress)
    for path in set(before) - set(after):
        resolve_inside(repo.root, path).unlink(missing_ok=True)
    progress.close()
