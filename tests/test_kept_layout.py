"""The kept versions' layout after a prune (store/kept_bases.py): the tree search is exact over
nested trees within the depth bound, and the cost estimate orders deltas by what they change."""

import itertools
import math

import numpy as np
from hypothesis import given, settings, strategies as st

from wvc.store.kept_bases import estimated_bits, nested_tree


def _depths(parents, root_depth):
    depths = [root_depth]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    return depths


def _nested(parents) -> bool:
    """Every version between a parent and its child descends from that parent."""
    def descends(k, ancestor):
        while k is not None and k > ancestor:
            k = parents[k]
        return k == ancestor
    return all(descends(k, p) for c, p in enumerate(parents) if p is not None for k in range(p + 1, c))


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.floats(0, 100) | st.just(math.inf), min_size=n * n, max_size=n * n),
    st.integers(0, 2), st.integers(1, 4))))
def test_the_tree_search_finds_the_cheapest_nested_tree_within_the_depth_bound(case):
    n, flat, root_depth, max_depth = case
    cost = lambda parent, child: flat[parent * n + child]  # noqa: E731
    best = math.inf
    for choice in itertools.product(*[range(c) for c in range(1, n)]):
        parents = [None, *choice]
        if _nested(parents) and max(_depths(parents, root_depth)) <= max_depth:
            best = min(best, sum(cost(p, c) for c, p in enumerate(parents) if p is not None))
    found = nested_tree(n, cost, root_depth, max_depth)
    if best == math.inf:
        assert found is None
        return
    assert found is not None and found[0] is None
    assert _nested(found) and max(_depths(found, root_depth)) <= max_depth
    assert math.isclose(sum(cost(p, c) for c, p in enumerate(found) if p is not None), best)


def test_a_delta_over_more_steps_is_estimated_to_cost_more():
    rng = np.random.default_rng(0)
    x = rng.integers(-5000, 5000, 1 << 15)
    versions = [x]
    for _ in range(40):
        y = versions[-1].copy()
        moved = rng.choice(y.size, y.size // 50, replace=False)
        y[moved] += rng.choice([-2, -1, 1, 2], moved.size)
        versions.append(y)
    spans = [estimated_bits(versions[0], versions[k], "float") for k in (1, 2, 10, 40)]
    assert spans == sorted(spans) and spans[0] > 0
    assert estimated_bits(x, x, "float") == 0
    assert estimated_bits(None, x, "float") == 8 * x.nbytes  # no base at that place: all of it


def test_a_version_whose_tensors_changed_at_different_steps_stays_only_on_the_versions_holding_its_bases():
    from wvc.store.kept_bases import staying_parents
    from wvc.store.rows import ObjectRow

    def row(oid, base):
        return ObjectRow(oid, "p", 0, 10, 100, 7, base, 1)

    # versions 0..3 of two places: "w" changes every version, "v" only at version 1
    versions = [{"w": "w0", "v": "v0"}, {"w": "w1", "v": "v1"}, {"w": "w2", "v": "v1"}, {"w": "w3", "v": "v3"}]
    new = [[("w", "w0"), ("v", "v0")], [("w", "w1"), ("v", "v1")], [("w", "w2")], [("w", "w3"), ("v", "v3")]]
    rows = {"w1": row("w1", "w0"), "v1": row("v1", "v0"), "w2": row("w2", "w1"), "w3": row("w3", "w2"),
            "v3": row("v3", "v0")}  # v3 is a delta on v0, which only version 0 holds
    fixed = staying_parents(versions, new, rows, needs=lambda c: False)
    # version 3: w on version 2's, v on version 0's; (taken as "anywhere, at no cost" before)
    assert fixed == {1: {0}, 2: {1}, 3: {0, 2}}
    assert staying_parents(versions, new, rows, needs=lambda c: c == "w2") == {1: {0}, 3: {0, 2}}
    other = {**rows, "w3": row("w3", "elsewhere"), "v3": row("v3", "elsewhere")}
    assert staying_parents(versions, new, other, needs=lambda c: False)[3] is None  # no kept version holds them
