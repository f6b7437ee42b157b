"""One rank of a DCP save or load, run as its own process by tests/test_dcp.py and
benchmarks/dcp.py (gloo on CPU, tensors sharded on dim 0 with distribute_tensor).

    python -m tests.dcp_worker RANK WORLD PORT JSON_ARGS

The model is deterministic: every rank can rebuild the full tensors of any step to compare.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

SHAPES = {"embed.weight": (96, 64), "layers.0.attn.weight": (64, 64), "layers.0.mlp.weight": (130, 64),
          "layers.1.attn.weight": (64, 64), "layers.1.mlp.weight": (130, 64), "norm.weight": (64,)}


def full_tensors(step: int, shapes=SHAPES, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Step 0: random weights; each later step moves every 50th element by one unit in the last place."""
    out = {}
    for i, (name, shape) in enumerate(sorted(shapes.items())):
        g = torch.Generator().manual_seed(1000 + i)
        t = (torch.randn(shape, generator=g) * 0.02).to(dtype)
        bits = t.view(torch.int16).reshape(-1)
        for s in range(1, step + 1):
            bits[s % 50::50] += 1
        out[name] = t
    return out


def state_dict(step: int, mesh, shapes=SHAPES, dtype=torch.bfloat16) -> dict:
    sd = {name: distribute_tensor(t, mesh, [Shard(0)]) for name, t in full_tensors(step, shapes, dtype).items()}
    sd["trainer"] = {"step": step, "note": f"saved at step {step}"}  # DCP stores these as bytes items
    return sd


def empty_state_dict(mesh, shapes=SHAPES, dtype=torch.bfloat16) -> dict:
    sd = {name: distribute_tensor(torch.zeros(shape, dtype=dtype), mesh, [Shard(0)]) for name, shape in shapes.items()}
    sd["trainer"] = {"step": -1, "note": ""}
    return sd


def main(rank: int, world: int, port: int, args: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (world,))
    from wvc.integrations.dcp import WvcStorageReader, WvcStorageWriter

    report = {"rank": rank}
    action = args["action"]
    if action in ("save", "kill-write", "kill-finish"):
        if action == "kill-write" and rank == args["victim"]:
            real = WvcStorageWriter._write_rank

            def die(self, *a, **k):
                real(self, *a, **k)  # its pack is sealed, then the rank dies before reporting
                os._exit(9)

            WvcStorageWriter._write_rank = die
        if action == "kill-finish" and rank == 0:
            from wvc.store.graph import CommitGraph

            CommitGraph.add_commit = lambda *a, **k: os._exit(9)  # inside the coordinator's transaction
        for step in args["steps"]:
            writer = WvcStorageWriter(args["repo"], message=f"step {step}", metadata={"step": step})
            t = time.perf_counter()
            dcp.save(state_dict(step, mesh), storage_writer=writer)
            report.setdefault("save_seconds", []).append(time.perf_counter() - t)
            if rank == 0:
                report.setdefault("commits", []).append(writer.commit)
    elif action == "load":  # one version, or several in turn ("loads": [[rev, step], ...])
        report["loads"] = []
        for rev, step in args.get("loads", [[args.get("rev", "HEAD"), args.get("step")]]):
            sd = empty_state_dict(mesh)
            reader = WvcStorageReader(args["source"], rev)
            t = time.perf_counter()
            dcp.load(sd, storage_reader=reader)
            seconds = time.perf_counter() - t
            expected = full_tensors(step)
            equal = {name: bool(torch.equal(sd[name].full_tensor().view(torch.int16),
                                            expected[name].view(torch.int16))) for name in expected}
            report["loads"].append({"rev": rev, "equal": equal, "trainer": sd["trainer"],
                                    "downloaded_bytes": reader.downloaded_bytes, "seconds": seconds})
        report.update(report["loads"][-1])
    dist.barrier()
    with open(args["out"] + f".{rank}.json", "w") as fh:
        json.dump(report, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
