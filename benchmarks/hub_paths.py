"""The Hub's transfer paths on the local server: a model repo through Xet (huggingface_hub's
default whenever hf_xet is installed), through LFS (``HF_HUB_DISABLE_XET=1``), and a Storage
Bucket (Xet only), for the same histories.

    python -m benchmarks.hub_paths [--minilm-steps 20] [--small-steps 100]

Two histories, each committed and pushed every step, once per path, each path on a fresh server
(nothing of one run is there to deduplicate the next against):
- **MiniLM bf16**: all-MiniLM-L6-v2 trained in bf16 with AdamW (lr 1e-5), as benchmarks/sync.py;
- **small steps**: three 256x512 bf16 tensors, ~1% of one of them nudged a step.
Per path: bytes the pushes uploaded (request bodies the server received, by kind: Xet xorbs and
shards, LFS objects, commits) against what wvc pushed (its packs and catalogs: the stored
bytes), requests per push, push seconds; a follower's bytes (served by the server) and seconds
per step; then a clone's requests, bytes and seconds. Every version the follower and the clone
reach is compared by digest. Results: benchmarks/results/hub_paths.{json,md}.

Xet re-chunks our packs with its own content-defined chunking and compresses chunks with LZ4:
our packs are zstd-compressed deltas, so LZ4 finds little; what Xet can save is a chunk sent
before (a pack re-sent by a compacting push). The table says what it costs or saves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

RESULTS = Path(__file__).parent / "results"


def small_steps(steps: int):
    g = torch.Generator().manual_seed(0)
    sd = {f"w{i}": (torch.randn(256, 512, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}
    yield 0, sd
    for step in range(1, steps + 1):
        flat = sd["w1"].view(torch.int16).reshape(-1)
        idx = torch.randint(0, flat.numel(), (flat.numel() // 100,), generator=g)
        flat[idx] += 1
        yield step, sd


def digest(sd: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def run(history: str, steps_iter, path: str, work: Path) -> dict:
    import os

    from huggingface_hub import constants

    import wvc
    from wvc.testing.hub import HubServer

    hub = HubServer(work / f"hub-{history}-{path}").start()
    os.environ["HF_ENDPOINT"] = hub.base_url
    constants.HF_HUB_DISABLE_XET = path == "lfs"  # as the environment variable does, read at each upload
    repo = wvc.Repo.init(work / f"{history}-{path}")
    url = f"hf://buckets/bench/{history}" if path == "bucket" else f"hf://bench/{history}"
    repo.remote_add("origin", url)
    pushes, follows, digests, follower = [], [], {}, None
    for step, sd in steps_iter:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(repo.root / "model.safetensors"))
        commit = repo.commit(f"step {step}").commit
        digests[commit] = digest(sd)
        received, requests, t = dict(hub.received_bytes), len(hub.requests), time.perf_counter()
        pushed = repo.push("origin", "main")
        seconds = time.perf_counter() - t
        got = {k: hub.received_bytes.get(k, 0) - received.get(k, 0) for k in hub.received_bytes}
        pushes.append({"step": step, "pushed": pushed.uploaded_bytes, "received": got,
                       "requests": len(hub.requests) - requests, "seconds": seconds})
        if follower is None:
            follower = wvc.follow(url)
        served, t = hub.served_bytes, time.perf_counter()
        update = follower.update(timeout=120)
        assert update is not None and update.commit == commit, f"{history}/{path}: the follower missed step {step}"
        assert digest(follower.state_dict) == digests[commit], f"{history}/{path}: step {step} differs"
        follows.append({"step": step, "served": hub.served_bytes - served, "seconds": time.perf_counter() - t})
    served, requests, t = hub.served_bytes, len(hub.requests), time.perf_counter()
    copy = wvc.clone(url, work / f"{history}-{path}-clone")
    clone = {"served": hub.served_bytes - served, "requests": len(hub.requests) - requests,
             "seconds": time.perf_counter() - t}
    for commit, expected in digests.items():
        assert digest(copy.load_state_dict(commit)) == expected, f"{history}/{path}: the clone's {commit} differs"
    hub.shutdown()
    hub.server_close()
    return {"history": history, "path": path, "steps": len(pushes), "pushes": pushes, "follows": follows,
            "clone": clone}


def summary(res: dict) -> dict:
    pushes, follows = res["pushes"][1:], res["follows"][1:]  # after the first (whole-model) step
    total = lambda key: sum(p["received"].get(key, 0) for p in res["pushes"])  # noqa: E731
    uploaded = sum(sum(p["received"].values()) for p in res["pushes"])
    pushed = sum(p["pushed"] for p in res["pushes"])
    return {
        "history": res["history"], "path": res["path"], "steps": res["steps"],
        "pushed_bytes": pushed, "uploaded_bytes": uploaded, "uploaded_over_pushed": uploaded / pushed,
        "xorb_bytes": total("xet-xorbs"), "shard_bytes": total("xet-shards"), "lfs_object_bytes": total("lfs-objects"),
        "commit_bytes": total("commit") + total("bucket-batch"),
        "requests_per_push": statistics.median(p["requests"] for p in pushes),
        "push_seconds_median": statistics.median(p["seconds"] for p in pushes),
        "follower_bytes_median": statistics.median(f["served"] for f in follows),
        "follower_seconds_median": statistics.median(f["seconds"] for f in follows),
        "clone_requests": res["clone"]["requests"], "clone_bytes": res["clone"]["served"],
        "clone_seconds": res["clone"]["seconds"],
    }


def markdown(rows: list[dict]) -> str:
    out = ["| history | path | steps | wvc pushed | uploaded (xorbs / shards / LFS / commits) | uploaded / pushed | "
           "requests a push | push s | follower bytes a step | follower s | clone requests | clone bytes | clone s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['history']} | {r['path']} | {r['steps']} | {r['pushed_bytes'] / 1e6:.2f} MB | "
                   f"{r['uploaded_bytes'] / 1e6:.2f} MB ({r['xorb_bytes'] / 1e6:.2f} / {r['shard_bytes'] / 1e3:.1f} KB / "
                   f"{r['lfs_object_bytes'] / 1e6:.2f} / {r['commit_bytes'] / 1e3:.1f} KB) | {r['uploaded_over_pushed']:.3f} | "
                   f"{r['requests_per_push']:.0f} | {r['push_seconds_median']:.2f} | "
                   f"{r['follower_bytes_median'] / 1e3:.1f} KB | {r['follower_seconds_median']:.2f} | "
                   f"{r['clone_requests']} | {r['clone_bytes'] / 1e6:.2f} MB | {r['clone_seconds']:.2f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    import os
    import subprocess
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minilm-steps", type=int, default=20)
    ap.add_argument("--small-steps", type=int, default=100)
    ap.add_argument("--path", choices=("xet", "lfs", "bucket"), help="run one path only (in this process)")
    ap.add_argument("--out", type=Path, help="with --path: where its results go")
    args = ap.parse_args(argv)
    if args.path is None:
        # each path in a process of its own: hf_xet keeps one session a process, with a cache of
        # the chunks it uploaded that would let one run deduplicate against another
        work = Path(tempfile.mkdtemp(prefix="wvc-hub-paths-"))
        results = []
        for path in ("xet", "lfs", "bucket"):
            out = work / f"{path}.json"
            subprocess.run([sys.executable, "-m", "benchmarks.hub_paths", "--path", path, "--out", str(out),
                            "--minilm-steps", str(args.minilm_steps), "--small-steps", str(args.small_steps)],
                           check=True)
            results += json.loads(out.read_text())
        rows = [summary(r) for r in results]
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "hub_paths.json").write_text(json.dumps({"summaries": rows, "runs": results}, indent=1))
        (RESULTS / "hub_paths.md").write_text(markdown(rows))
        print(markdown(rows))
        return
    work = Path(tempfile.mkdtemp(prefix=f"wvc-hub-paths-{args.path}-"))
    os.environ.update(HF_TOKEN="local", HF_HUB_CACHE=str(work / "hf-cache"), WVC_CACHE=str(work / "wvc-cache"),
                      HF_XET_CACHE=str(work / "xet-cache"), HF_HUB_DISABLE_PROGRESS_BARS="1")
    from .sync import minilm_bf16_steps

    results = []
    if args.minilm_steps:
        results.append(run("minilm-bf16", minilm_bf16_steps(args.minilm_steps), args.path, work))
        print(json.dumps(summary(results[-1])), flush=True)
    if args.small_steps:
        results.append(run("small-steps", small_steps(args.small_steps), args.path, work))
        print(json.dumps(summary(results[-1])), flush=True)
    args.out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
