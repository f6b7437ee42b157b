"""One worker of a server whose workers share one follower (tests/test_shared_follower.py):
rank ``r`` of ``world`` (gloo), an engine that keeps its shard of every tensor (the r-th
of ``world`` equal pieces of the flat tensor), fed from the group's shared host copy."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file


class Applied:
    def __init__(self, names):
        self.names = sorted(names)

    def to_json(self):
        return {"names": self.names}


class ShardEngine:
    """A stand-in for one worker's engine weights: its shard of each tensor, copied out of
    the host copy it is given (as vLLM's loaders copy a rank's shard out of a checkpoint
    tensor)."""

    def __init__(self, rank, world, start, fail_on=None):
        self.rank, self.world, self.fail_on = rank, world, fail_on
        self.weights = {name: self.shard(t) for name, t in start.items()}
        self.applies = 0

    def shard(self, tensor):
        return tensor.reshape(-1).view(torch.uint8).chunk(self.world)[self.rank].clone()

    def prepare(self, host, changed):
        return {}

    def reloaded_whole(self, name):
        return name.startswith("layer")  # (as a packed module's tensors: no use for their indices)

    def apply(self, host, changed, patches=None, prepared=None):
        self.applies += 1
        self.patched = sorted(patches or {})
        if self.fail_on == self.applies:
            name = sorted(changed)[0]
            self.weights[name][:1] ^= 1  # a write that went in part way
            raise RuntimeError("the engine refused the write")
        for name in changed:
            self.weights[name] = self.shard(host[name])
        return Applied(changed)

    def digest(self):
        return {name: hashlib.sha256(t.numpy().tobytes()).hexdigest() for name, t in sorted(self.weights.items())}


def shared_mappings() -> list[str]:
    with open("/proc/self/maps") as fh:
        return sorted({line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                       for line in fh if "/wvc-host-" in line})


def main(rank, world, port, args):
    from pathlib import Path

    from wvc.integrations.vllm import shared_host
    from wvc.integrations.vllm.server_group import ServerGroup
    from wvc.integrations.vllm.session import EngineFollower

    if args.get("shm_dir"):
        shared_host.SHM_DIR = Path(args["shm_dir"])  # (a host without usable shared memory)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = ServerGroup(dist.group.WORLD, rank, world)
    engine = ShardEngine(rank, world, load_file(f"{args['model']}/model.safetensors"),
                         fail_on=args.get("fail_on") if rank == args.get("fail_rank") else None)
    # started at a version the engine's files are not: the leader's check fails, the group agrees,
    # and the last worker alone raises it (the others' callers drop the session)
    try:
        wrong = EngineFollower(lambda names: engine, args["remote"], "main", at=args["steps"][0],
                               model=args["model"], group=group)
        wrong_start = {"failed": None if wrong.failed is None else type(wrong.failed).__name__}
        del wrong  # (as a caller drops it: its host copy goes with it)
    except Exception as exc:  # noqa: BLE001 - what the test checks
        wrong_start = {"raised": [type(exc).__name__, str(exc)]}
    gc.collect()
    session = EngineFollower(lambda names: engine, args["remote"], "main", at=args["first"], model=args["model"],
                             group=group)
    report = {"wrong_start": wrong_start, "info": session.info(), "follower": session.follower is not None, "mappings": shared_mappings(),
              "steps": []}
    try:
        report["unknown"] = {"returned": session.update(args["unknown"]), "held": session.commit}
    except Exception as exc:  # noqa: BLE001 - what the test checks
        report["unknown"] = {"raised": [type(exc).__name__, str(exc)], "held": session.commit}
    for commit in args["steps"]:
        step = {"commit": commit}
        try:
            up = session.update(commit)
            step["update"] = None if up is None else {"commit": up.commit, "changed": sorted(up.changed),
                                                      "downloaded": up.downloaded_bytes,
                                                      "indices_of": sorted(up.patches or {})}
        except Exception as exc:  # noqa: BLE001
            step["error"] = [type(exc).__name__, str(exc)]
        step["held"], step["digest"], step["unusable"] = session.commit, engine.digest(), session.unusable
        step["patched"] = getattr(engine, "patched", None)
        report["steps"].append(step)
    report["downloaded"] = 0 if session.follower is None else sum(s["update"]["downloaded"] for s in report["steps"]
                                                                  if s.get("update"))
    with open(f"{args['out']}.{rank}.json", "w") as fh:
        json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
    # The report is written and the group destroyed: end without the interpreter's teardown.
    # One rank of a full suite run on 2 loaded cores once aborted with "terminate called
    # without an active exception" (exit -6; not reproduced in isolation), and the teardown
    # is not what this worker checks: its report is.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
