"""The numbers the views draw, gathered from a repository (a ``wvc.Repo``, through its public
methods): its history, the change map (kept per commit by ops/changes.py), metrics from commit metadata, storage, and a
comparison of two versions (the data of ``wvc diff``). Plain dicts and lists, so the page,
``wvc plot`` and ``--json`` show the same numbers."""

from __future__ import annotations

import math
import re

from ..errors import InvalidArgument, VersionPruned
from ..store.refs import HEADS, REMOTES, TAGS, short_ref
from ..model.versions import finite_number

METRICS = {"rel_l2": "relative L2 change", "fraction": "fraction of elements changed", "ulps": "max |delta| in ULPs"}
DEFAULT_LIMIT = 200


def commits_of(repo, rev_range: str | None, limit: int = DEFAULT_LIMIT) -> list[str]:
    """The commits a REV-RANGE names, oldest first: ``A..B`` (B's first parents after A), or
    ``REV`` (its first parents, at most ``limit``); default HEAD."""
    if rev_range and ".." in rev_range:
        start, _, end = rev_range.partition("..")
        stop = repo.resolve(start or "HEAD")
        chain = repo.first_parent_history(end or "HEAD")
        if stop not in chain:
            raise InvalidArgument(f"{start} is not on the first-parent history of {end or 'HEAD'}")
        commits = chain[chain.index(stop) + 1:][-limit:]
        if not commits:
            raise InvalidArgument(f"{rev_range} names no versions ({end or 'HEAD'} is {start or 'HEAD'} itself)")
        return commits
    return repo.first_parent_history(rev_range or "HEAD", limit)


def summary(repo, commit_id: str) -> dict:
    c = repo.read_commit(commit_id)
    tree = repo.tree_of(commit_id, weights=False)
    return {"commit": commit_id, "parents": list(c.parents), "message": c.summary, "author": c.author,
            "timestamp": c.timestamp, "metadata": c.metadata, "logical_bytes": tree.logical_bytes,
            "stored_bytes": repo.stored_bytes(commit_id)}


def history(repo, limit: int = 500) -> dict:
    """Every ref, and the commits they reach (newest first, at most ``limit``)."""
    refs = {}
    for prefix, named in ((HEADS, repo.branches()), (TAGS, repo.tags()), (REMOTES, repo.remote_branches())):
        for name, target in named.items():
            refs[prefix + name] = target
    order = repo.ancestors(list(dict.fromkeys(refs.values())))
    order = sorted(order, key=lambda c: repo.read_commit(c).timestamp, reverse=True)[:limit]
    labels: dict[str, list[str]] = {}
    for ref, target in refs.items():
        labels.setdefault(target, []).append(short_ref(ref))
    return {"head": repo.head_branch(), "refs": refs,
            "commits": [{**summary(repo, c), "refs": sorted(labels.get(c, []))} for c in order]}


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def layer_of(tensor: str) -> str:
    """The layer a tensor belongs to: its name up to the first number (``encoder.layer.3``),
    else all but its last part."""
    parts = tensor.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or tensor


def value_of(change, metric: str) -> float | None:
    if change is None:
        return 0.0
    if metric == "rel_l2":
        return change.rel_l2
    if metric == "fraction":
        return change.changed / change.numel if change.changed is not None and change.numel else None
    if metric == "ulps":
        return None if change.max_ulps is None else float(change.max_ulps)
    raise InvalidArgument(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")


def _ready(repo, commits, compute: bool, progress) -> None:
    """The kept changes of ``commits``: computed now (``compute``), else they must exist
    (the server never writes: `wvc ui` computes them before it serves)."""
    from ..progress import NULL

    if compute:
        repo.compute_tensor_changes(commits, progress or NULL)
    elif (missing := repo.missing_tensor_changes(commits)):
        raise InvalidArgument(f"the changes of {len(missing)} of these commits are not computed yet: run "
                              f"`wvc plot changes` on this range, or restart `wvc ui` with --rev")


def change_map(repo, commits: list[str], metric: str = "rel_l2", progress=None, compute: bool = True) -> dict:
    """Tensors (rows, in model order, grouped by layer) by commits (columns): each tensor's
    change against the commit's first parent."""
    if metric not in METRICS:
        raise InvalidArgument(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")
    _ready(repo, commits, compute, progress)
    present = {c: [(f.path, t.name) for f in repo.tree_of(c, weights=False).files for t in f.tensors] for c in commits}
    names = dict.fromkeys(key for keys in present.values() for key in keys)
    if not names:
        raise InvalidArgument("no tensors in these versions (no safetensors files): nothing to draw")
    rows = sorted(names, key=lambda k: (k[0], _natural(layer_of(k[1])), _natural(k[1])))
    columns, cells = [], []
    for c in commits:
        meta = repo.read_commit(c).metadata
        columns.append({"commit": c, "step": meta.get("step") if isinstance(meta.get("step"), (int, float)) else None})
        here = set(present[c])
        by_key = {(ch.file, ch.tensor): ch for ch in repo.tensor_changes(c)}
        for r, key in enumerate(rows):
            if key not in here and key not in by_key:
                continue
            ch = by_key.get(key)
            cells.append({"row": r, "col": len(columns) - 1, "value": value_of(ch, metric),
                          "status": ch.status if ch else "unchanged", **({"change": ch.to_json()} if ch else {})})
    return {"metric": metric, "metric_label": METRICS[metric],
            "rows": [{"file": f, "tensor": t, "layer": layer_of(t)} for f, t in rows], "columns": columns,
            "cells": cells}


def metrics(repo, branches: list[str] | None = None, limit: int = 10_000) -> dict:
    """The numeric metadata of each branch's first-parent history, as series over step (the
    metadata ``step``, else the commit's place in the history)."""
    branches = branches or sorted(repo.branches())
    series: dict[str, dict[str, list]] = {}
    for b in branches:
        for i, c in enumerate(repo.first_parent_history(b, limit)):
            meta = repo.read_commit(c).metadata
            step = meta.get("step", i)
            if finite_number(step) is None:
                step = i
            for key, value in meta.items():
                if key != "step" and finite_number(value) is not None:  # (NaN, inf, a 401-digit int: skipped)
                    series.setdefault(key, {}).setdefault(b, []).append([step, value, c])
    return {"branches": branches, "series": series}


def storage(repo, commits: list[str], compute: bool = True) -> dict:
    """Stored and logical bytes per commit (and cumulative against full copies), stored
    bytes per tensor over these commits, and what each remote-tracking branch points to."""
    rows, stored_total, full_total = [], 0, 0
    per_tensor: dict[str, int] = {}
    _ready(repo, commits, compute, None)
    for c in commits:
        s = summary(repo, c)
        stored_total += s["stored_bytes"] or 0
        full_total += s["logical_bytes"]
        rows.append({"commit": c, "message": s["message"], "stored_bytes": s["stored_bytes"],
                     "logical_bytes": s["logical_bytes"], "cumulative_stored": stored_total,
                     "cumulative_full": full_total})
        for ch in repo.tensor_changes(c):
            if ch.stored_bytes:
                key = f"{ch.file}:{ch.tensor}"
                per_tensor[key] = per_tensor.get(key, 0) + ch.stored_bytes
    remotes = {}
    for name, target in repo.remote_branches().items():
        remote, _, branch = name.partition("/")
        remotes.setdefault(remote, {})[branch] = target
    return {"commits": rows, "per_tensor": dict(sorted(per_tensor.items(), key=lambda kv: -kv[1])),
            "remotes": remotes}


def compare(repo, a: str, b: str) -> dict:
    """``wvc diff A B``'s data, and the relative L2 change per layer (root of the sum of
    squares of its tensors' relative changes)."""
    result = repo.diff(a, b)
    layers: dict[str, float] = {}
    for t in result["tensors"]:
        if t["rel_l2"] is not None:
            key = layer_of(t["name"])
            layers[key] = layers.get(key, 0.0) + t["rel_l2"] ** 2
    return {"a": repo.resolve(a), "b": repo.resolve(b), "diff": result,
            "layers": {k: math.sqrt(v) for k, v in sorted(layers.items(), key=lambda kv: _natural(kv[0]))}}


def tensor_detail(repo, commit: str, file: str, tensor: str, bins: int = 40) -> dict:
    """One tensor's change in one commit against its first parent: a histogram of per-element
    changes in ULPs (log2 buckets) and the fraction changed in each chunk."""
    import torch

    from ..formats.dtypes import DTYPES
    from ..ops.diff import _SAME_WIDTH_INT, ordered_bits

    commit = repo.resolve(commit)
    new_tree = repo.tree_of(commit)  # pruned: say so, naming the nearest kept versions
    c = repo.read_commit(commit)
    old = None
    if c.parents:
        try:
            old_tree = repo.tree_of(c.parents[0])
        except VersionPruned as exc:
            raise VersionPruned(f"its change cannot be shown: its parent's weights are gone ({exc})") from None
        old = next((t for f in old_tree.files if f.path == file for t in f.tensors if t.name == tensor), None)
    new = next((t for f in new_tree.files if f.path == file for t in f.tensors if t.name == tensor), None)
    if new is None:
        raise InvalidArgument(f"no tensor {tensor!r} in {file} at {commit[:12]}")
    out = {"commit": commit, "file": file, "tensor": tensor, "dtype": new.dtype, "shape": list(new.shape),
           "chunks": [], "histogram": []}
    if old is None or old.dtype != new.dtype or old.shape != new.shape:
        out["note"] = "added, or its dtype or shape changed: no element-wise change"
        return out
    dt = DTYPES[new.dtype]
    bits = getattr(torch, _SAME_WIDTH_INT[dt.width])
    counts = [0] * bins
    for ca, cb in zip(old.chunks, new.chunks):
        if ca == cb:
            out["chunks"].append({"chunk": cb, "changed_fraction": 0.0})
            continue
        ua = torch.frombuffer(bytearray(repo.read_chunk(ca)), dtype=torch.uint8).view(bits)
        ub = torch.frombuffer(bytearray(repo.read_chunk(cb)), dtype=torch.uint8).view(bits)
        moved = ua != ub
        out["chunks"].append({"chunk": cb, "changed_fraction": float(moved.float().mean()) if len(ua) else 0.0})
        if dt.kind != "float" or not bool(moved.any()):
            continue
        d = (ordered_bits(ub[moved], dt.width).double() - ordered_bits(ua[moved], dt.width).double()).abs().clamp(min=1)
        buckets = torch.log2(d).floor().clamp(max=bins - 1).long()
        for k, n in zip(*torch.unique(buckets, return_counts=True)):
            counts[int(k)] += int(n)
    out["histogram"] = [{"ulps_from": 1 << k, "count": n} for k, n in enumerate(counts) if n]
    return out
