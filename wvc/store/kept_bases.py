"""Which kept version each kept version of a pruned run is re-encoded against.

A prune keeps a few versions of a run (every Nth, the last K, the tagged, the best) and
re-encodes their chunks whose chains ran through pruned ones. The kept version before is the
obvious base, but a chain of kept versions is ``max_chain`` deep after eight of them, and the
next one then starts again from the keyframe with the whole drift since step 0: on a
1,000-step run, steps 900 and 998 stored 1.3 MB each of the 7.5 MB left after pruning, where a
delta against a kept neighbour is 0.16 MB or 17 KB. A hierarchy with fixed spans (the anchor
policy's) fits kept versions badly: they are unevenly spaced (every 100th step, then ten in a
row), so a span of 16 kept versions reaches back 900 steps or 10.

So the layout is chosen by estimated cost: a tree over the kept versions, oldest at the root,
each version a delta against an earlier one, no deeper than ``max_chain``, with the least
estimated bytes. The estimate compares a few sampled places of each pair of versions (the
changed elements and the bits of their distance in units in the last place: what the delta
codecs spend). Trees are restricted to nested ones (a version's descendants are the versions
right after it, up to its next sibling), like every skip-delta layout; over those an interval
dynamic program is exact, in O(n^3 * max_chain) steps for n versions (at most
``MAX_VERSIONS``; a longer run lays out its newest ``MAX_VERSIONS``).

A version none of whose chunks needs re-encoding keeps its base unless moving it saves more
than ``REENCODE_MARGIN``: a prune applied as the run goes (the Publisher's ``keep``) does not
re-encode what the prune before laid out, while a version the run itself stored against the
keyframe (its chain outweighed it) can still move onto a kept neighbour.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..formats.dtypes import DTYPES, value_order
from ..lru import LRUCache

MAX_VERSIONS = 64  # the dynamic program's n (n^3 * max_chain steps; 0.16 s at 64 with its pruning)
SAMPLED_PLACES = 4  # places each pair of versions is compared at
SAMPLED_ELEMENTS = 1 << 15  # elements a sampled chunk is thinned to
SAMPLES_KEPT = 256  # sampled chunks remembered between prunes (ids name bytes: never stale), ~32 MiB
ESTIMATES_KEPT = 1 << 16  # estimates remembered between prunes, by (base chunk, chunk)
REENCODE_MARGIN = 0.25  # a version that can stay as stored moves only to save more than this


def nested_tree(n: int, cost, root_depth: int, max_depth: int) -> list[int | None] | None:
    """Parents (indices, None for the root 0) of the nested tree over versions 0..n-1 with
    the least total ``cost(parent, child)`` whose depth stays within ``max_depth`` when the
    root is ``root_depth`` deep; None when no such tree exists (``cost`` infinite where a
    version may not go)."""
    if n <= 1:
        return [None] * n

    @lru_cache(maxsize=None)
    def best(left: int, right: int, depth: int) -> tuple[float, int]:
        """Versions left+1..right placed under ``left`` (``depth`` deep): the least cost,
        and the last of ``left``'s children that reaches it."""
        if right == left:
            return 0.0, -1
        if depth + 1 > max_depth:
            return math.inf, -1
        least, choice = math.inf, -1
        for child in range(left + 1, right + 1):
            edge = cost(left, child)
            if edge == math.inf:
                continue
            total = best(left, child - 1, depth)[0] + edge
            if total >= least:
                continue
            total += best(child, right, depth + 1)[0]
            if total < least:
                least, choice = total, child
        return least, choice

    if best(0, n - 1, root_depth)[0] == math.inf:
        return None
    parents: list[int | None] = [None] * n
    todo = [(0, n - 1, root_depth)]
    while todo:
        left, right, depth = todo.pop()
        child = best(left, right, depth)[1]
        if child < 0:
            continue
        parents[child] = left
        todo += [(left, child - 1, depth), (child, right, depth + 1)]
    best.cache_clear()
    return parents


def estimated_bits(a, b, kind: str) -> float:
    """About what a delta of ``b`` against ``a`` (sampled integers, value-ordered for floats)
    costs: which elements changed (the entropy of the changed fraction, each element), and
    for floats each change's sign and bits of distance in units in the last place."""
    if a is None or b is None or a.shape != b.shape:
        return float(8 * (b.nbytes if b is not None else a.nbytes))
    changed = a != b
    count = int(np.count_nonzero(changed))
    if count == 0:
        return 0.0
    p = count / changed.size
    where = 0.0 if p >= 1 else -changed.size * (p * math.log2(p) + (1 - p) * math.log2(1 - p))
    if kind != "float":
        return where + 8.0 * count
    return where + count + float(np.log2(1.0 + np.abs(b[changed] - a[changed])).sum())


def _sample(raw: bytes, width: int, kind: str):
    """A chunk's bytes, thinned to SAMPLED_ELEMENTS, as integers in value order (floats)."""
    signed = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}.get(width, np.int8)
    x = np.frombuffer(raw, dtype=signed, count=len(raw) // np.dtype(signed).itemsize)
    x = x[::max(1, x.size // SAMPLED_ELEMENTS)].astype(np.int64)
    if kind == "float":
        x = value_order(x, 8 * width)
    return x.astype(np.int32) if width <= 2 else x


# what a prune applied as the run goes (every few commits) sampled and estimated, so the next
# one does it only for what is new
_SAMPLES: LRUCache = LRUCache(SAMPLES_KEPT)
_ESTIMATES: LRUCache = LRUCache(ESTIMATES_KEPT)


def kept_parents(store, versions: list, dtypes: dict[str, str], rows, needs, max_depth: int,
                 root_depth: int) -> tuple[list[int | None], set[int]] | None:
    """The layout (:func:`nested_tree`) of ``versions`` (the run's kept versions, oldest first,
    each a ``tree_diff.places`` dict): parents by index, and the versions that stay as stored;
    None where there is nothing to lay out or no tree fits. ``needs(chunk)``: whether the
    chunk must be re-encoded (its chain runs through a freed one); ``rows``: the chain rows
    of every chunk involved. A version that could stay as stored (none of its chunks needs
    re-encoding) is placed on another parent only where that is estimated to save more than
    REENCODE_MARGIN."""
    n = len(versions)
    if n <= 1:
        return None
    seen: dict[str, int] = {}
    for k, places in enumerate(versions):
        for chunk in places.values():
            seen.setdefault(chunk, k)
    new = [[(p, c) for p, c in places.items() if seen[c] == k] for k, places in enumerate(versions)]
    fixed = staying_parents(versions, new, rows, needs)
    if len(fixed) == n - 1:
        return None  # nothing to re-encode: the layout stays as it is
    changing = [p for p, c in versions[0].items() if versions[-1].get(p) not in (None, c)]
    floats = [p for p in changing if getattr(DTYPES.get(dtypes.get(versions[0][p], "")), "kind", None) == "float"]
    pool = floats or changing
    picked = [pool[round(i * (len(pool) - 1) / max(1, SAMPLED_PLACES - 1))] for i in range(min(SAMPLED_PLACES, len(pool)))]
    picked = list(dict.fromkeys(picked))

    known = store.recent_decoded  # the places' chains share links (and pushes decoded some)

    def sample(chunk: str):
        found = _SAMPLES.get(chunk)
        if found is None:
            dtype = DTYPES.get(dtypes.get(chunk, ""))
            width, kind = (dtype.width, dtype.kind) if dtype is not None else (1, "bits")
            found = (_sample(store.get_from(chunk, known), width, kind), kind)
            _SAMPLES.put(chunk, found)
        return found

    for place in picked:  # oldest first: each version's chain starts from links decoded before
        for places in versions:
            if place in places:
                sample(places[place])

    def estimate(parent: int, child: int, place) -> float:
        a, b = versions[parent].get(place), versions[child].get(place)
        if a == b:
            return 0.0
        found = _ESTIMATES.get((a, b))
        if found is None:
            sa, sb = (sample(a) if a else None), (sample(b) if b else None)
            found = estimated_bits(sa[0] if sa else None, sb[0] if sb else None, (sb or sa)[1])
            _ESTIMATES.put((a, b), found)
        return found

    def cost(parent: int, child: int) -> float:
        if child in fixed and fixed[child] is None:
            return 0.0  # it stays as stored, wherever it is placed
        total = sum(estimate(parent, child, place) for place in picked)
        if child in fixed and parent not in fixed[child]:
            total *= 1 + REENCODE_MARGIN  # moved: re-encoded, only where that saves enough
        return total

    cached: dict[tuple[int, int], float] = {}

    def memo_cost(parent: int, child: int) -> float:
        key = (parent, child)
        if key not in cached:
            cached[key] = cost(parent, child)
        return cached[key]

    parents = nested_tree(n, memo_cost, root_depth, max_depth)
    if parents is None:
        return None
    return parents, {k for k, allowed in fixed.items() if allowed is None or parents[k] in allowed}


def staying_parents(versions: list, new: list, rows, needs) -> dict[int, set[int] | None]:
    """For each version (by index) none of whose new chunks (``new[k]``: (place, chunk) pairs)
    needs re-encoding: the kept versions holding its chunks' bases at the same places, its
    parents if it stays as stored; None when no base is a kept version's (another branch's).
    A version whose tensors changed at different steps has bases in several versions: all of
    them count (it was taken as placeable anywhere at no cost, and the versions laid out on
    it went past max_chain)."""
    fixed: dict[int, set[int] | None] = {}
    for k in range(1, len(versions)):
        if any(needs(c) for _, c in new[k]):
            continue
        allowed: set[int] = set()
        for place, chunk in new[k]:
            base = _base(rows, chunk)
            allowed |= {j for j in range(k) if base is not None and versions[j].get(place) == base}
        fixed[k] = allowed or None
    return fixed


def _base(rows, chunk: str) -> str | None:
    row = rows.get(chunk)
    return row.base if row is not None else None
