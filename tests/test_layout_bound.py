"""benchmarks/layout_bound.py's claim rests on its dynamic program finding the cheapest nested
tree: checked against prune's interval search (store/kept_bases.py, written separately) on
random span costs, and against a direct search over every tree for small windows."""

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.layout_bound import cheapest_trees, cost_curve, mean_depth, policy_cost, tree_of
from wvc.store.kept_bases import nested_tree

# a delta over more steps costs no less (what the codec measures): increments of a span's cost
growth = st.lists(st.floats(min_value=0.0, max_value=20, allow_nan=False), min_size=8, max_size=8)


def _spans(increments):
    return list(np.cumsum([1.0, *increments]))


def _tree_cost(parents, c):
    return sum(c[child - parent] for child, parent in enumerate(parents) if parent is not None)


def _depths(parents):
    depth = [0] * len(parents)
    for child, parent in enumerate(parents):
        if parent is not None:
            depth[child] = depth[parent] + 1
    return depth


@settings(max_examples=40, deadline=None)
@given(growth, st.integers(min_value=1, max_value=4))
def test_the_cheapest_tree_costs_what_prunes_interval_search_finds(increments, depth):
    c = np.array([0.0] + _spans(increments))
    best = cheapest_trees(c, 9, depth)
    for n in range(2, 10):
        parents = nested_tree(n, lambda p, q: float(c[q - p]), 0, depth)
        assert math.isclose(best[depth][n], _tree_cost(parents, c), rel_tol=1e-9)


@settings(max_examples=25, deadline=None)
@given(growth, st.integers(min_value=1, max_value=3))
def test_no_tree_within_the_depth_bound_is_cheaper(increments, depth):
    """Every tree on 6 versions (each version's base any earlier one), nested or not: with
    costs that grow with the span, a crossing layout is never cheaper."""
    c = np.array([0.0] + _spans(increments))
    n = 6
    least = math.inf
    for parents in itertools.product(*[range(k) for k in range(1, n)]):
        tree = [None, *parents]
        if max(_depths(tree)) <= depth:
            least = min(least, _tree_cost(tree, c))
    assert math.isclose(cheapest_trees(c, n, depth)[depth][n], least, rel_tol=1e-9)


@settings(max_examples=40, deadline=None)
@given(growth, st.integers(min_value=1, max_value=4))
def test_the_tree_rebuilt_from_the_choices_costs_the_least_and_stays_within_the_depth(increments, depth):
    c = np.array([0.0] + _spans(increments))
    best, choices = cheapest_trees(c, 9, depth, with_choices=True)
    for n in range(2, 10):
        parents = tree_of(choices, n, depth)
        assert parents[0] is None and all(p is not None and p < child for child, p in enumerate(parents) if child)
        assert max(_depths(parents)) <= depth
        assert math.isclose(_tree_cost(parents, c), best[depth][n], rel_tol=1e-9)
        assert mean_depth(parents) == sum(_depths(parents)) / (n - 1)


def test_the_cost_curve_passes_through_the_measured_spans_and_grows_between_them():
    c = cost_curve({1: 100, 2: 170, 4: 260, 8: 410}, 16)
    assert [round(c[s], 6) for s in (1, 2, 4, 8)] == [1.0, 1.7, 2.6, 4.1]
    assert all(c[s] < c[s + 1] for s in range(1, 16))


def test_the_policy_pays_step_deltas_when_a_span_costs_no_more_than_a_step():
    """With every span costing one step, any layout costs one a version: the policy's
    simulation adds costs and nothing else."""
    c = np.array([0.0] + [1.0] * 300)
    assert math.isclose(policy_cost(c, keyframe=1000.0, steps=300, max_chain=8), 1.0, rel_tol=1e-3)
