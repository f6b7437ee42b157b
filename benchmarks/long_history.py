"""Long histories on the local Hub server (remote format 2, compaction on or off).

N pushes of one small commit each (a 16 KB bf16 model, like a callback pushing every
save), then a clone and a fetch of one new commit, counting the server's HTTP requests;
also M pushes of a fine-tune's steps (a 4 MB bf16 model, every weight moving a little).
With ``--compare``, the same run with compaction off (``WVC_COMPACT_FANOUT=0``: one
segment a push, as many catalogs as pushes) for the small-commit case.

    python -m benchmarks.long_history [--pushes 1000] [--finetune-pushes 100] [--compare 200]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUN = r"""
import json, os, sys, time
from pathlib import Path
import torch
from safetensors.torch import save_file
import wvc
from wvc.testing.hub import HubServer

pushes, numel, root = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
server = HubServer(root / "hub").start()
os.environ.update(HF_ENDPOINT=server.base_url, HF_TOKEN="bench", HF_HUB_DISABLE_TELEMETRY="1")
repo = wvc.Repo.init(root / "a")
g = torch.Generator().manual_seed(0)
w = torch.randn(numel, generator=g) * 0.02
repo.remote_add("origin", "hf://bench/long")
push_s = []
for i in range(pushes):
    w += torch.randn(numel, generator=g) * 1e-3
    save_file({"w": w.to(torch.bfloat16)}, str(root / "a" / "model.safetensors"))
    repo.commit(f"step {i}")
    t = time.perf_counter()
    repo.push()
    push_s.append(time.perf_counter() - t)
meta = server.storage.load("models", "bench/long")
files = len(meta["commits"][meta["branches"]["main"]]["files"])
before, t = len(server.requests), time.perf_counter()
copy = wvc.clone("hf://bench/long", root / "copy")
clone_s, clone_requests = time.perf_counter() - t, len(server.requests) - before
same = (root / "copy" / "model.safetensors").read_bytes() == (root / "a" / "model.safetensors").read_bytes()
w += torch.randn(numel, generator=g) * 1e-3
save_file({"w": w.to(torch.bfloat16)}, str(root / "a" / "model.safetensors"))
repo.commit("one more")
repo.push()
before = len(server.requests)
copy.fetch()
print(json.dumps({"pushes": pushes, "model_bytes": numel * 2, "remote_files": files,
                  "clone_requests": clone_requests, "clone_s": clone_s, "byte_identical": same,
                  "fetch_one_commit_requests": len(server.requests) - before,
                  "push_s_median": sorted(push_s)[len(push_s) // 2], "push_s_max": max(push_s),
                  "push_s_last_100_median": sorted(push_s[-100:])[len(push_s[-100:]) // 2]}))
"""


def run(pushes: int, numel: int, fanout: str | None = None) -> dict:
    env = {**os.environ, "HF_HUB_DISABLE_XET": "1"}  # the local server speaks LFS; read at import
    if fanout is not None:
        env["WVC_COMPACT_FANOUT"] = fanout
    with tempfile.TemporaryDirectory(prefix="wvc-long-") as tmp:
        out = subprocess.run([sys.executable, "-c", RUN, str(pushes), str(numel), tmp], env=env,
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the run of {pushes} pushes failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--pushes", type=int, default=1000)
    ap.add_argument("--finetune-pushes", type=int, default=100)
    ap.add_argument("--compare", type=int, default=200, help="pushes for the compaction-off comparison (0: skip)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    report = {"small commits": run(args.pushes, 8 << 10)}
    if args.finetune_pushes:
        report["fine-tune steps"] = run(args.finetune_pushes, 2 << 20)
    if args.compare:
        report[f"small commits, {args.compare} pushes, compaction on"] = run(args.compare, 8 << 10)
        report[f"small commits, {args.compare} pushes, compaction off"] = run(args.compare, 8 << 10, fanout="0")
    report["seconds"] = time.perf_counter() - started
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
