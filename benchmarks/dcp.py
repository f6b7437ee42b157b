"""DCP saves through wvc against torch's FileSystemWriter: 4 ranks (gloo, CPU), an
LLM-shaped bf16 model sharded on dim 0 with DTensor, Adam-like steps.

Per step: bytes each writer adds to storage and the wall time of ``dcp.save`` (both
measured on the same run, same state dicts). Then the last step loaded by both readers at
the same world size and at another one, and each rank's peak RSS.

    python -m benchmarks.dcp [--gb 1.0] [--steps 5] [--world 4] [--load-world 2]

Writes benchmarks/results/dcp.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "dcp.json"


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rank_main(rank: int, world: int, port: int, args: dict) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from benchmarks.cases import llm_shapes
    from wvc.integrations.dcp import WvcStorageReader, WvcStorageWriter

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (world,))
    shapes = llm_shapes(args["gb"] * 1e9)
    work = Path(args["work"])
    report: dict = {"rank": rank, "steps": []}

    def shard_rows(shape):
        rows = shape[0]
        step = -(-rows // world)  # torch.chunk's split, as Shard(0) does
        return min(rank * step, rows), min((rank + 1) * step, rows)

    def empty_like_model():
        sd = {}
        for name, shape in shapes.items():
            lo, hi = shard_rows(shape)
            local = torch.zeros((hi - lo, *shape[1:]), dtype=torch.bfloat16)
            sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                          stride=torch.empty(shape, device="meta").stride())
        return sd

    if args["action"] == "save":
        g = torch.Generator().manual_seed(1000 + rank)
        master = {}
        for name, shape in shapes.items():  # this rank's rows only: nothing whole is ever built
            lo, hi = shard_rows(shape)
            std = 0.02 if "embed" in name or "lm_head" in name else (1.0 / shape[-1] ** 0.5 if len(shape) > 1 else 0.05)
            base = 1.0 if name.endswith("norm.weight") else 0.0
            master[name] = base + torch.randn((hi - lo, *shape[1:]), generator=g) * std
        for step in range(args["steps"]):
            if step:
                for w in master.values():  # Adam-like: |update| ~ lr for every element
                    w.add_(torch.randn(w.shape, generator=g).clamp_(-3, 3), alpha=-args["lr"])
            sd = {}
            for name, shape in shapes.items():
                sd[name] = DTensor.from_local(master[name].to(torch.bfloat16), mesh, [Shard(0)], run_check=False,
                                              shape=torch.Size(shape), stride=torch.empty(shape, device="meta").stride())
            row = {"step": step}
            dist.barrier()
            t = time.perf_counter()
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(work / f"fs-{step}")))
            dist.barrier()
            row["fs_seconds"] = time.perf_counter() - t
            writer = WvcStorageWriter(work / "wvc", message=f"step {step}")
            t = time.perf_counter()
            dcp.save(sd, storage_writer=writer)
            dist.barrier()
            row["wvc_seconds"] = time.perf_counter() - t
            row["wvc_stored_bytes"] = writer.stored_bytes if rank == 0 else None
            report["steps"].append(row)
            del sd
    else:
        for kind in ("fs", "wvc"):
            sd = empty_like_model()
            reader = dcp.FileSystemReader(str(work / f"fs-{args['steps'] - 1}")) if kind == "fs" \
                else WvcStorageReader(work / "wvc")
            dist.barrier()
            t = time.perf_counter()
            dcp.load(sd, storage_reader=reader)
            dist.barrier()
            report[f"{kind}_load_seconds"] = time.perf_counter() - t
            if kind == "fs":
                reference = {k: v.to_local().clone() for k, v in sd.items()}
            else:
                report["equal"] = all(torch.equal(sd[k].to_local().view(torch.int16), reference[k].view(torch.int16))
                                      for k in sd)
            del sd
    report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(Path(args["out"] + f".{rank}.json"), "w") as fh:
        json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()


def launch(world: int, args: dict) -> list[dict]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.dcp", "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--args", json.dumps(args)], env=env) for r in range(world)]
    if any(p.wait() for p in procs):
        raise SystemExit("a rank failed")
    return [json.loads(Path(args["out"] + f".{r}.json").read_text()) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--load-world", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--args")
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a.rank, a.world, a.port, json.loads(a.args))
    work = Path(tempfile.mkdtemp(prefix="wvc-dcp-bench-"))
    try:
        common = {"gb": a.gb, "steps": a.steps, "lr": a.lr, "work": str(work)}
        saves = launch(a.world, {**common, "action": "save", "out": str(work / "save")})
        steps = []
        for i, row in enumerate(saves[0]["steps"]):
            steps.append({"step": i, "fs_bytes": dir_bytes(work / f"fs-{i}"), "wvc_bytes": row["wvc_stored_bytes"],
                          "fs_seconds": round(max(r["steps"][i]["fs_seconds"] for r in saves), 3),
                          "wvc_seconds": round(max(r["steps"][i]["wvc_seconds"] for r in saves), 3)})
        loads = {}
        for world in (a.world, a.load_world):
            res = launch(world, {**common, "action": "load", "out": str(work / f"load{world}")})
            loads[world] = {"fs_seconds": round(max(r["fs_load_seconds"] for r in res), 3),
                            "wvc_seconds": round(max(r["wvc_load_seconds"] for r in res), 3),
                            "equal": all(r["equal"] for r in res),
                            "peak_rss_mb": [round(r["peak_rss_mb"]) for r in res]}
        result = {"model_gb": a.gb, "world": a.world, "lr": a.lr, "steps": steps, "loads": loads,
                  "save_peak_rss_mb": [round(r["peak_rss_mb"]) for r in saves],
                  "machine": f"{os.cpu_count()} cores", "date": datetime.date.today().isoformat()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'step':>4} {'FileSystemWriter':>18} {'wvc':>12} {'ratio':>7} {'fs save s':>10} {'wvc save s':>11}")
    for s in steps:
        print(f"{s['step']:>4} {s['fs_bytes'] / 1e6:>15.1f} MB {s['wvc_bytes'] / 1e6:>9.1f} MB "
              f"{s['fs_bytes'] / s['wvc_bytes']:>6.1f}x {s['fs_seconds']:>10.2f} {s['wvc_seconds']:>11.2f}")
    for world, l in loads.items():
        print(f"load at world {world}: FileSystemReader {l['fs_seconds']:.2f} s, wvc {l['wvc_seconds']:.2f} s, "
              f"equal: {l['equal']}, peak RSS per rank {l['peak_rss_mb']} MB")
    print(f"save peak RSS per rank: {result['save_peak_rss_mb']} MB")


if __name__ == "__main__":
    main()
