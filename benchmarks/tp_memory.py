"""Host memory of a tensor-parallel vLLM server following a branch (issue 65: one host copy
per server, not per worker).

    VENV=$(bash .ci/vllm-env)
    VENV/bin/python -m benchmarks.tp_memory [--model 75m] [--steps 5] [--tp 2]
                                            [--out benchmarks/results/tp_memory.json]

Runs in the vLLM environment. The model and its steps are benchmarks/vllm_sync.py's (a
Qwen2-shaped random init, AdamW-like steps at lr 1e-6, bf16, published by ``wvc.Publisher`` to
a directory remote). Two engines, one after the other, each an in-process ``vllm.LLM`` with
``tensor_parallel_size`` worker processes (the CPU backend, packed weights):

- **fresh**: started from the last step's checkout, probed; no follower;
- **follower**: started from step 0's checkout, ``attach(llm, remote, at=step 0)``, updated to
  each step, probed.

Exact means every module of every worker holds what the fresh engine's does: each module's
weight bytes and, for a module that multiplies by a weight (a linear layer, whose weight the
CPU backend keeps only in a packed copy; an embedding or LM head with a packed copy of its
own), its output on a fixed input, hashed (``ModuleDigests``); the run fails otherwise. The
outputs (greedy tokens, top-5 logprobs) are compared too and reported: they are not the
oracle here, since a TP=2 CPU engine's logprobs varied between runs of the same fresh engine
under CPU load (3 different results in 5 runs beside two busy processes, the same in 5 of 5
without): the reductions' order follows the threads' timing.

Memory is the proportional set size (PSS, ``/proc/PID/smaps_rollup``) summed over the engine's
process tree (the driver, the engine core, the workers): a page shared by the workers (the host
copy in ``/dev/shm``) counts once, where RSS would count it in every worker that touched it.
Read after the engine has started, after attaching, and after the last update; each worker's
own peak RSS (VmHWM, shared pages counted in full) too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _field(path: str, name: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory() -> dict:
    """This process tree's summed PSS, and each process's peak RSS."""
    from tests_vllm.engine import process_tree

    pids = process_tree(os.getpid())
    return {"pss": sum(_field(f"/proc/{p}/smaps_rollup", "Pss") for p in pids),
            "shmem_pss": sum(_field(f"/proc/{p}/smaps_rollup", "Pss_Shmem") for p in pids),
            "peak_rss": {str(p): _field(f"/proc/{p}/status", "VmHWM") for p in pids},
            "processes": len(pids)}


class ModuleDigests:
    """A worker extension: ``module_digests()``, each module's weight bytes and (where it
    multiplies by a weight) its output on a fixed input, hashed: what a worker's engine holds,
    packed copies included, compared exactly across engines."""

    def module_digests(self) -> dict:
        import hashlib

        import torch

        model = self.model_runner.get_model()
        gen = torch.Generator().manual_seed(0)
        out = {}
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.Tensor):
                continue
            h = hashlib.sha256(weight.detach().contiguous().view(torch.uint8).numpy().tobytes()
                               if weight.numel() else b"")
            method = getattr(module, "quant_method", None)
            width = getattr(module, "input_size_per_partition", None) or (weight.shape[1] if weight.dim() == 2 else None)
            if method is not None and hasattr(method, "apply") and width:
                x = torch.randn(3, width, generator=gen).to(torch.bfloat16)
                with torch.no_grad():
                    y = method.apply(module, x, getattr(module, "bias", None))
                h.update(y.float().contiguous().numpy().tobytes())
            out[name] = h.hexdigest()
        return out


def _engine(model_dir: str, tp: int):
    from tests_vllm import engine

    return engine.start_tp(model_dir, tp, worker_extension_cls="benchmarks.tp_memory.ModuleDigests")


def engine_main(args) -> None:
    """One engine process: fresh (no remote) or following ``remote`` through ``steps``."""
    from tests_vllm import engine

    llm = _engine(args.engine, args.tp)
    out = {"started": memory()}
    if args.remote:
        from wvc.integrations.vllm import attach

        attached = attach(llm, args.remote, "main", at=args.at)
        out["attached"] = memory()
        out["host_copies"] = [i["host_copy"] for i in attached.info()]
        out["updates"] = []
        for commit in args.commits.split(","):
            t0 = time.perf_counter()
            up = attached.update(commit)
            out["updates"].append({"commit": up.commit, "downloaded": up.downloaded_bytes,
                                   "seconds": time.perf_counter() - t0})
    out["probe"] = engine.probe(llm)
    out["end"] = memory()
    out["modules"] = llm.collective_rpc("module_digests")
    print("RESULT " + json.dumps(out), flush=True)


def _run(args: list[str]) -> dict:
    import subprocess

    res = subprocess.run([sys.executable, "-m", "benchmarks.tp_memory", *args], capture_output=True, text=True,
                         timeout=1800, cwd=Path(__file__).parent.parent)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"engine process failed (rc {res.returncode}):\n{res.stderr[-4000:]}")


def run(name: str, steps: int, tp: int, work: Path) -> dict:
    import torch

    from wvc import Repo
    from wvc.integrations.publisher import Publisher

    from .cases import adam_step
    from .vllm_sync import MODELS, build, publish

    train = work / "trainer"
    master = build(train, MODELS[name])
    model_bytes = 2 * sum(t.numel() for t in master.values())
    publish(train, master)
    repo = Repo.init(train)
    remote = str(work / "remote")
    repo.remote_add("origin", remote)
    first = repo.commit("step 0").commit
    repo.push()
    repo.checkout(first, output=work / "start")
    repo.create_branch("trainer")
    repo.checkout("trainer")
    repo.close()
    pub = Publisher(train, "main", push_to=remote, push_interval=0, max_pending=1)
    g = torch.Generator().manual_seed(1)
    commits = []
    for step in range(1, steps + 1):
        adam_step(master, g, 1e-6)
        job = pub.publish({k: v.to(torch.bfloat16) for k, v in master.items()}, message=f"step {step}", wait=True)
        if job.commit is None or not pub.flush(timeout=600):
            raise SystemExit(f"step {step} was not published: {pub.errors}")
        commits.append(job.commit)
    pub.close()
    repo = Repo.open(train)
    repo.checkout(commits[-1], output=work / "last")
    repo.close()
    fresh = _run(["--engine", str(work / "last"), "--tp", str(tp)])
    follower = _run(["--engine", str(work / "start"), "--tp", str(tp), "--remote", remote, "--at", first,
                     "--commits", ",".join(commits)])
    differ = [f"worker {rank}: {name}" for rank, (a, b) in enumerate(zip(fresh["modules"], follower["modules"]))
              for name in sorted(a) if a[name] != b.get(name)]
    if differ or len(fresh["modules"]) != len(follower["modules"]):
        raise SystemExit(f"the following engine's weights differ from a fresh engine's: {differ[:5]}")
    added = follower["end"]["pss"] - fresh["end"]["pss"]
    return {"model": name, "tp": tp, "model_bytes": model_bytes, "steps": steps, "exact": True,
            "modules_compared": sum(len(m) for m in fresh["modules"]), "outputs_equal": follower["probe"] == fresh["probe"],
            "fresh": {k: fresh[k] for k in ("started", "end")},
            "follower": {k: follower[k] for k in ("started", "attached", "end", "host_copies", "updates")},
            "added_pss": added, "added_copies": added / model_bytes}


def markdown(r: dict) -> str:
    mb = lambda b: f"{b / 1e6:.0f}"  # noqa: E731
    f, w = r["fresh"], r["follower"]
    shared = all(h["shared"] for h in w["host_copies"])
    return "\n".join([
        "| model | TP | checkpoint MB | host copy | engine PSS MB (fresh / following, end) | added by the follower MB "
        "(checkpoints) | of it in /dev/shm MB | exact (modules; outputs) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {r['model']} | {r['tp']} | {mb(r['model_bytes'])} | {'one, shared' if shared else 'one a worker'} | "
        f"{mb(f['end']['pss'])} / {mb(w['end']['pss'])} | {mb(r['added_pss'])} ({r['added_copies']:.2f}x) | "
        f"{mb(w['end']['shmem_pss'] - f['end']['shmem_pss'])} | {r['steps']} steps: {r['modules_compared']} of "
        f"{r['modules_compared']}; {'equal' if r['outputs_equal'] else 'differ'} |", ""])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="75m")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "tp_memory.json")
    ap.add_argument("--engine")  # (internal: one engine process)
    ap.add_argument("--remote")
    ap.add_argument("--at")
    ap.add_argument("--commits")
    args = ap.parse_args(argv)
    if args.engine:
        return engine_main(args)
    with tempfile.TemporaryDirectory(prefix="wvc-tp-") as tmp:
        result = run(args.model, args.steps, args.tp, Path(tmp))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
