"""A large LLM-shaped bf16 model (5.7 GB by default): commit, keyframe checkout and the tip of a
chain's checkout against zstd, with each wvc process's peak RSS (issue 53).

    python -m benchmarks.large_model [--gb 5.7] [--steps 8] [--pairs 3] [--work DIR]
                                     [--out benchmarks/results/large_model.json]

The model: ``cases.llm_shapes`` at ``--gb`` (hidden 2048, vocab 32000), random bf16 weights.
Its steps move a calibrated fraction of the elements by a few units in the last place, as
``long_run``'s synthetic steps do (the real bf16 run's figures: the changed fraction, the
chance an element that moved moves again and the same way, the size of a move), kept lean
enough for this size: the state and one byte an element of the step before stay in memory.

Measured, each as A/B pairs run in turn on the same page-cache state (order flipped a pair):
- a keyframe commit (step 0 onto an empty repository) against ``zstd -3 -T2`` of the file;
- each step's delta commit onto the chain against ``zstd -3 -T2`` of that step's file;
- step 0's checkout (a keyframe) against ``zstd -d`` of step 0's ``.zst``;
- the tip's checkout (the newest step, its chain as deep as ``max_chain`` allows) against
  step 0's checkout;
every version checked out compared with its file by sha256. Each wvc operation runs in its own
process (benchmarks/wvc_op.py), so its time includes the interpreter's start and its peak RSS
is its own. Writes the JSON and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from . import cases as C
from .long_run import move_bits

RESULTS = Path(__file__).parent / "results"
# the real bf16 run's step (benchmarks/results/long_run_1000_step_blocks.json's calibration)
CHANGED, P_AGAIN, P_SAME = 0.0261, 0.9544, 0.9976
ULPS = [0.6, 0.25, 0.1, 0.05]  # |move| of 1, 2, 3, 4 units in the last place


def model(gb: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random bf16 weights of the LLM shape, a tensor at a time (no fp32 copy of the model)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in C.llm_shapes(gb * 1e9).items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.05 * torch.randn(shape, generator=g)
        else:
            w = torch.randn(shape, generator=g) * (0.02 if "embed" in name or "lm_head" in name else shape[-1] ** -0.5)
        out[name] = w.to(torch.bfloat16)
    return out


def step(state: dict, prev: dict, g: torch.Generator) -> None:
    """Move ``state`` one step in place; ``prev``: each element's move at the step before (-1, 0, 1)."""
    dist = torch.tensor(ULPS, dtype=torch.float64)
    for name, t in state.items():
        prev[name] = move_bits(t.view(torch.int16).reshape(-1), prev.get(name), CHANGED, dist, P_AGAIN, P_SAME, g)


def save(state: dict, path: Path) -> str:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    return sha256(path)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _run(args: list[str]) -> dict:
    """One command after a sync: its wall time, and a wvc_op's own report."""
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    res = subprocess.run(args, check=True, capture_output=True, text=True)
    out = {"seconds": time.perf_counter() - t}
    if args[:3] == [sys.executable, "-m", "benchmarks.wvc_op"]:
        out.update({f"op_{k}": v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()})
    return out


def wvc(*args) -> list[str]:
    return [sys.executable, "-m", "benchmarks.wvc_op", *map(str, args)]


def in_turn(k: int, a, b) -> tuple[dict, dict]:
    """a and b one after the other, b first on odd pairs."""
    if k % 2:
        rb = b()
        return a(), rb
    ra = a()
    return ra, b()


def ratios(pairs: list[tuple[dict, dict]]) -> dict:
    r = [a["seconds"] / b["seconds"] for a, b in pairs]
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "pairs": len(r),
            "a_seconds": statistics.median(a["seconds"] for a, _ in pairs),
            "b_seconds": statistics.median(b["seconds"] for _, b in pairs)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=5.7)
    ap.add_argument("--steps", type=int, default=8, help="steps committed after step 0 (the chain)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir; needs ~6x --gb)")
    ap.add_argument("--out", type=Path, default=RESULTS / "large_model.json")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="wvc-large-", dir=args.work))
    try:
        result = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    md = markdown(result)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)


def measure(args, work: Path) -> dict:
    from wvc import Repo

    t = time.perf_counter()
    state = model(args.gb)
    first, tip = work / "step0" / "model.safetensors", work / "tip" / "model.safetensors"
    digests = {0: save(state, first)}
    size = first.stat().st_size
    print(json.dumps({"built": size, "seconds": time.perf_counter() - t}), flush=True)
    zst, dec = work / "model.zst", work / "dec.safetensors"

    def zstd_c(src):
        return lambda: _run(["zstd", "-3", "-T2", "-q", "-f", str(src), "-o", str(zst)])

    # keyframe commits: step 0 onto an empty repository, each pair its own
    keyframe = []
    for k in range(args.pairs):
        repo = work / f"repo{k}"
        shutil.rmtree(repo, ignore_errors=True)
        Repo.init(repo).close()
        keyframe.append(in_turn(k, lambda: _run(wvc("commit", repo, first.parent, "step 0")), zstd_c(first)))
        if k < args.pairs - 1:
            shutil.rmtree(repo)
    repo = work / f"repo{args.pairs - 1}"
    step0 = keyframe[-1][0]["op_commit"]
    print(json.dumps({"keyframe_commit": ratios(keyframe)}), flush=True)

    # the chain: each step's delta commit, paired with zstd of the same file
    g, prev, deltas, commits = torch.Generator().manual_seed(1), {}, [], {0: step0}
    for s in range(1, args.steps + 1):
        step(state, prev, g)
        digests[s] = save(state, tip)
        a, b = in_turn(s, lambda: _run(wvc("commit", repo, tip.parent, f"step {s}")), zstd_c(tip))
        commits[s] = a["op_commit"]
        deltas.append((a, b))
        print(json.dumps({"step": s, "commit_s": a["seconds"], "zstd_s": b["seconds"],
                          "stored": a["op_stored_bytes"], "rss": a["op_peak_rss_bytes"]}), flush=True)
    del state, prev
    r = Repo.open(repo)
    depth = max(len(r.internals.store.chain(c)) for c in r.tree_of(commits[args.steps]).chunk_ids())
    stored = sum(a["op_stored_bytes"] for a, _ in keyframe[-1:] + deltas)
    r.close()

    # checkouts: step 0 against zstd -d, the tip against step 0; every output checked
    _run(["zstd", "-3", "-T2", "-q", "-f", str(first), "-o", str(zst)])
    out = work / "out"

    def checkout(s):
        def go():
            res = _run(wvc("checkout", repo, commits[s], out))
            got = sha256(out / "model.safetensors")
            assert got == digests[s], f"step {s} checked out differently"
            return res
        return go

    zstd_d = lambda: _run(["zstd", "-d", "-q", "-f", str(zst), "-o", str(dec)])  # noqa: E731
    key_vs_zstd, tip_vs_key = [], []
    for k in range(args.pairs):
        key_vs_zstd.append(in_turn(k, checkout(0), zstd_d))
        tip_vs_key.append(in_turn(k, checkout(args.steps), checkout(0)))
    rss = [a["op_peak_rss_bytes"] for pairs in (keyframe, deltas, key_vs_zstd) for a, _ in pairs] + \
        [x["op_peak_rss_bytes"] for pair in tip_vs_key for x in pair]
    return {
        "gb": args.gb, "file_bytes": size, "steps": args.steps, "tip_depth": depth, "stored_bytes": stored,
        "cpus": os.cpu_count(), "torch": torch.__version__,
        "keyframe_commit_over_zstd3_T2": ratios(keyframe),
        "delta_commit_over_zstd3_T2": ratios(deltas),
        "keyframe_checkout_over_zstd_d": ratios(key_vs_zstd),
        "tip_checkout_over_keyframe_checkout": ratios(tip_vs_key),
        "peak_rss_max_bytes": max(rss),
        "stored_per_step": [a["op_stored_bytes"] for a, _ in deltas],
    }


def markdown(r: dict) -> str:
    def row(name, key, target):
        x = r[key]
        return (f"| {name} | {x['median']:.2f} ({x['min']:.2f}-{x['max']:.2f}, {x['pairs']} pairs) "
                f"| {x['a_seconds']:.1f} s / {x['b_seconds']:.1f} s | {target} |")

    return "\n".join([
        f"# A {r['file_bytes'] / 1e9:.1f} GB LLM-shaped bf16 model (`python -m benchmarks.large_model`)", "",
        f"{r['steps']} steps after step 0, the tip's longest chain {r['tip_depth']} payloads (its keyframe "
        f"included); {r['cpus']} CPUs; "
        f"stored {r['stored_bytes'] / 1e9:.2f} GB in all; peak RSS of any wvc process "
        f"{r['peak_rss_max_bytes'] / 2**20:.0f} MiB (target < 256 MiB).", "",
        "| A / B | ratio (median, range) | A s / B s (medians) | issue 53's target |", "|---|---|---|---|",
        row("keyframe commit / `zstd -3 -T2`", "keyframe_commit_over_zstd3_T2", "<= 1.0"),
        row("delta commit / `zstd -3 -T2`", "delta_commit_over_zstd3_T2", "<= 1.0"),
        row("keyframe checkout / `zstd -d`", "keyframe_checkout_over_zstd_d", "<= 1.0"),
        row("tip checkout / keyframe checkout", "tip_checkout_over_keyframe_checkout", "<= 2.5"),
    ])


if __name__ == "__main__":
    main()
