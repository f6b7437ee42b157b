"""How few bytes a step any chain layout within a depth bound can store, against the anchor policy.

    python -m benchmarks.layout_bound [--at 1024] [--window 1024] [--depths 2,4,8,12,16]

A layout within ``max_chain`` encodes each version against an earlier one so that no chain
is deeper than the bound. Every skip-delta layout (Subversion's, the anchor hierarchy's,
prune's kept layout) is a nested tree: a version's descendants are the versions right after
it up to its next sibling. On the calibrated synthetic run (benchmarks/long_run.py) this:

1. measures what a delta over a span of S steps costs, ``c(S)``, with the real codec, on one
   1 MB bf16 tensor at step ``--at`` (for S = 1, 2, 4, ... ; the context of a span-S delta
   is the version 2S back, as an anchor's is; costs between powers of two interpolated on
   log-log axes), and the keyframe's size;
2. finds the cheapest nested tree over a window of ``--window`` versions for each depth
   bound (an exact dynamic program on those costs; the window's first version is its root
   and not counted), in units of one step delta;
3. runs the anchor policy (store/anchors.py, with the payload rule) on the same costs.

Prints one JSON line; ``--out`` also writes it. What it answers: whether a target of
"stored bytes a step <= k x a step delta" is reachable at a depth bound, and how far the
policy is from the best layout. It does not model the run's changed fraction falling over
time (the costs are those around step ``--at``), nor keyframes refreshed inside the window.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from wvc import codec
from wvc.store import anchors
from wvc.store.rows import ObjectRow

from .anchor_policy import BF16, calibrated_tensor, chain_of, decode_seconds


def span_costs(at: int, max_span: int, seed: int = 0) -> tuple[dict[int, int], int, float]:
    """{S: bytes of the version at ``at`` encoded over S steps} for S a power of two up to
    ``max_span``, the keyframe's bytes, and a step delta's decode time over the keyframe's
    (best of 3 each), on the calibrated run's 1 MB tensor."""
    keep = {at} | {at - s for s in _powers(max_span)} | {at - 2 * s for s in _powers(max_span)}
    versions = {t: x for t, x in calibrated_tensor(at, seed=seed) if t in keep}
    x = versions[at]
    costs = {s: len(codec.encode(x, BF16, versions[at - s], context=versions.get(at - 2 * s)).payload)
             for s in _powers(max_span)}
    keyframe = codec.encode(x, BF16, None).payload
    step = codec.encode(x, BF16, versions[at - 1], context=versions[at - 2]).payload
    link = decode_seconds(step, len(x), versions[at - 1], versions[at - 2])
    return costs, len(keyframe), link / decode_seconds(keyframe, len(x), None, None)


def _powers(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]


def cost_curve(costs: dict[int, int], window: int) -> np.ndarray:
    """c[S] for S in 0..window, in step deltas (c[1] = 1): the measured points, interpolated
    linearly on log-log axes between them and extrapolated from the last two."""
    xs = sorted(costs)
    lx, ly = np.log([float(s) for s in xs]), np.log([costs[s] / costs[1] for s in xs])
    spans = np.arange(1, window + 1, dtype=float)
    inside = np.interp(np.log(spans), lx, ly)
    slope = (ly[-1] - ly[-2]) / (lx[-1] - lx[-2]) if len(xs) > 1 else 0.0
    beyond = ly[-1] + slope * (np.log(spans) - lx[-1])
    c = np.exp(np.where(spans > xs[-1], beyond, inside))
    return np.concatenate([[0.0], c])


def cheapest_trees(c: np.ndarray, window: int, depth: int, with_choices: bool = False):
    """best[r][L]: the least total cost of a nested tree over L consecutive versions, the
    first its root (not counted) and every other within r links of it, a link over S steps
    costing c[S]. Exact: the root's children are the versions starting the consecutive
    groups its other versions split into, each group a tree within r - 1 below its first.

    For each r, H[L, x] is the least cost of the versions x..L-1 of a window of L, as the
    root's children's groups: H[L, x] = c[x] + min over the next group's start b in (x, L]
    of best[r - 1][b - x] + H[L, b], with H[L, L] = 0. Every window length at once.

    ``with_choices``: also the b each minimum took, choice[r][L, x], from which
    :func:`tree_of` rebuilds the trees (memory: depth x window^2 int32)."""
    inf = np.inf
    best = np.full((depth + 1, window + 1), inf)
    best[:, 1] = 0.0
    lengths = np.arange(window + 1)
    choices = np.zeros((depth + 1, window + 1, window + 1), dtype=np.int32) if with_choices else None
    for r in range(1, depth + 1):
        below = best[r - 1]
        h = np.full((window + 1, window + 2), inf)
        h[lengths, lengths] = 0.0
        for x in range(window - 1, 0, -1):
            # candidates b = x+1 .. window for every L; those past L are inf in h
            totals = below[1: window - x + 1][None, :] + h[:, x + 1: window + 1]
            k = np.argmin(totals, axis=1)
            h[:, x] = c[x] + totals[lengths, k]
            if choices is not None:
                choices[r, :, x] = x + 1 + k
            h[x, x] = 0.0  # (the window that ends at x: nothing left to cover)
        best[r] = h[:, 1]
        best[r, 1] = 0.0
    return (best, choices) if with_choices else best


def tree_of(choices: np.ndarray, length: int, depth: int) -> list[int | None]:
    """Parents (None for the root 0) of the cheapest tree over ``length`` versions within
    ``depth``, from :func:`cheapest_trees`' choices."""
    parents: list[int | None] = [None] * length
    todo = [(0, length, depth)]  # (root, versions in its subtree, depth budget below it)
    while todo:
        root, size, budget = todo.pop()
        x = 1
        while x < size:
            b = int(choices[budget, size, x])
            parents[root + x] = root
            todo.append((root + x, b - x, budget - 1))
            x = b
    return parents


def mean_depth(parents: list[int | None]) -> float:
    depth = [0] * len(parents)
    for child, parent in enumerate(parents):
        if parent is not None:
            depth[child] = depth[parent] + 1
    return sum(depth[1:]) / max(1, len(parents) - 1)


def policy_cost(c: np.ndarray, keyframe: float, steps: int, max_chain: int,
                choose=anchors.choose_base) -> float:
    """The anchor policy's stored cost a step over ``steps`` versions after a keyframe, a link
    over S steps costing c[S] (beyond the curve: the keyframe's cost, its ceiling)."""
    scale = 1000  # ObjectRow lengths are ints: costs in thousandths of a step delta
    rows = {0: ObjectRow("0", "", 0, int(keyframe * scale), 1, 1, None, 0)}
    positions: dict[str, int] = {}
    total = 0.0
    for t in range(1, steps + 1):
        suffix, position = choose(chain_of(rows, t - 1), positions, max_chain)
        base = int(suffix[0].id)
        cost = min(float(c[t - base]) if t - base < len(c) else keyframe, keyframe)
        rows[t] = ObjectRow(str(t), "", 0, int(cost * scale), 1, 7, str(base), rows[base].depth + 1)
        if position:
            positions[str(t)] = position
        total += cost
    return total / steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--at", type=int, default=1024, help="the step whose span costs are measured")
    ap.add_argument("--window", type=int, default=1024, help="versions in the layout (after its root)")
    ap.add_argument("--depths", default="1,2,3,4,6,8,12,16")
    ap.add_argument("--max-chain", type=int, default=8, help="the policy's depth bound")
    ap.add_argument("--power", type=float, help="no measurement: a span of S steps costs S**POWER step deltas")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    depths = sorted({int(d) for d in args.depths.split(",")})
    if args.power is not None:
        c = np.concatenate([[0.0], np.arange(1, args.window + 1, dtype=float) ** args.power])
        keyframe, out = 1e9, {"power": args.power, "window": args.window}  # (no payload rule: no keyframe size)
    else:
        max_span = 1 << int(math.log2(args.at // 2))
        costs, keyframe_bytes, link_over_keyframe = span_costs(args.at, max_span)
        c = cost_curve(costs, args.window)
        keyframe = keyframe_bytes / costs[1]
        out = {"at": args.at, "window": args.window, "step_bytes": costs[1], "keyframe_in_steps": round(keyframe, 1),
               "span_cost_in_steps": {s: round(b / costs[1], 2) for s, b in costs.items()},
               # a chain's decode is its keyframe's and one of these a link: the depth at which
               # a tip decodes within 2x its keyframe's is 1 / this, rounded down
               "step_link_decode_over_keyframe": round(link_over_keyframe, 2)}
    best, choices = cheapest_trees(c, args.window + 1, max(depths), with_choices=True)
    out |= {
        "best_a_step_by_depth": {d: round(float(best[d][args.window + 1]) / args.window, 3) for d in depths},
        # how deep the cheapest trees' chains are on average: what a reader pays for them
        "best_mean_depth_by_depth": {d: round(mean_depth(tree_of(choices, args.window + 1, d)), 2) for d in depths},
        "policy_a_step": round(policy_cost(c, keyframe, args.window, args.max_chain), 3),
        "policy_max_chain": args.max_chain}
    out["policy_over_best"] = round(out["policy_a_step"] / out["best_a_step_by_depth"].get(args.max_chain, math.nan), 3)
    line = json.dumps(out)
    print(line, flush=True)
    if args.out:
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
