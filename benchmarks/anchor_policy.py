"""Anchor policies on one chunk over a long run: bytes stored a step and the cost of decoding
the tip, with the real codec and the real policy (store/anchors.py), without a repository.

    python -m benchmarks.anchor_policy [--steps 1000] [--max-chain 8] [--policy hierarchy|nearest|flat]

One 1 MB bf16 tensor of the calibrated synthetic run (benchmarks/long_run.py) moves a step at
a time. Each version is encoded against the base the policy picks (``flat``: every version
against its parent, re-anchored to the keyframe at the depth bound, the policy before the
hierarchy; ``nearest``: the hierarchy before its positions jumped ahead at a full chain), and
each payload's decode is timed (best of 3). Prints one JSON line:
stored bytes a step over the median step delta (what a follower gets), over the whole run and
its second half; chain depth; and the decode time of each version's whole chain over the
keyframe's, averaged over the second half.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from wvc import codec
from wvc.formats.dtypes import DTYPES
from wvc.store import anchors
from wvc.store.rows import ObjectRow

from . import retired_anchor_policies as retired
from .long_run import synthetic_steps

BF16 = DTYPES["BF16"]
CALIBRATION = Path(__file__).parent / "results" / "long_run_fixed.json"


def calibrated_tensor(steps: int, seed: int = 0):
    """(step, bytes) of the calibrated synthetic run's 1 MB bf16 tensor, steps 0..``steps``."""
    data = json.loads(CALIBRATION.read_text())
    cal = next(r["calibration"] for r in data["runs"].values() if "calibration" in r)
    for t, state in synthetic_steps(steps, 1, cal, seed=seed):
        yield t, state["layer.0.mlp.weight"].contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()


def decode_seconds(payload: bytes, raw_size: int, base, context) -> float:
    """A payload's decode time, best of 3."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        codec.decode(payload, raw_size, base, context=context)
        best = min(best, time.perf_counter() - t)
    return best


def chain_of(rows: dict[int, ObjectRow], version: int) -> list[ObjectRow]:
    """The chain of a simulated version (rows by version number, ids their numbers): itself
    first, its keyframe last, as the policy takes it."""
    chain, k = [], version
    while k is not None:
        chain.append(rows[k])
        k = int(rows[k].base) if rows[k].base is not None else None
    return chain


def simulate(steps: int, max_chain: int, policy: str) -> dict:
    versions = [x for _, x in calibrated_tensor(steps)]
    choose = {"hierarchy": anchors.choose_base, "nearest": retired.choose_base_nearest,
              "flat": retired.choose_base_flat}[policy]
    rows: dict[int, ObjectRow] = {}
    positions: dict[str, int] = {}
    seconds: dict[int, float] = {}
    step_bytes = []
    for t, x in enumerate(versions):
        base_t = None
        if t:
            suffix, position = choose(chain_of(rows, t - 1), positions, max_chain)
            base_t = int(suffix[0].id)
            step = versions[t - 2] if t >= 2 else None
            step_bytes.append(len(codec.encode(x, BF16, versions[t - 1], context=step).payload))
        context_t = int(rows[base_t].base) if base_t is not None and rows[base_t].base is not None else None
        base = versions[base_t] if base_t is not None else None
        context = versions[context_t] if context_t is not None else None
        enc = codec.encode(x, BF16, base, context=context)
        if not enc.uses_base:
            base_t, base, context, position = None, None, None, 0
        rows[t] = ObjectRow(str(t), "", 0, len(enc.payload), len(x), int(enc.method),
                            None if base_t is None else str(base_t), 0 if base_t is None else rows[base_t].depth + 1)
        if t and position:
            positions[str(t)] = position
        seconds[t] = decode_seconds(enc.payload, len(x), base, context)

    def chain_seconds(t):
        total = 0.0
        while t is not None:
            total += seconds[t]
            t = int(rows[t].base) if rows[t].base is not None else None
        return total

    median = sorted(step_bytes)[len(step_bytes) // 2]
    half = range(steps // 2, steps + 1)
    stored = [rows[t].length for t in range(1, steps + 1)]
    costs = [chain_seconds(t) / seconds[0] for t in half]
    return {"steps": steps, "max_chain": max_chain, "policy": policy, "fanout": anchors.ANCHOR_SPACING, "keyframe_bytes": rows[0].length,
            "step_median_bytes": median,
            "stored_mean_over_median": round(sum(stored) / len(stored) / median, 2),
            "stored_second_half_over_median": round(sum(rows[t].length for t in half) / len(half) / median, 2),
            "depth_max": max(r.depth for r in rows.values()),
            "depth_mean": round(sum(r.depth for r in rows.values()) / len(rows), 1),
            "tip_decode_over_keyframe_mean": round(sum(costs) / len(costs), 2),
            "tip_decode_over_keyframe_max": round(max(costs), 2)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--max-chain", type=int, default=8)
    ap.add_argument("--policy", choices=("hierarchy", "nearest", "flat"), default="hierarchy")
    args = ap.parse_args(argv)
    print(json.dumps(simulate(args.steps, args.max_chain, args.policy)), flush=True)


if __name__ == "__main__":
    main()
