"""A follower's fetch of RL-like steps without an engine: seconds a step and the follower's
memory, on a Qwen2-shaped checkpoint (issue 65).

    python -m benchmarks.follow_fetch [--model 0.5b|75m] [--steps 6] [--attach-at K]

An fp32 master moved by AdamW-like steps (lr 1e-6, |update| ~ lr on every element, as in
benchmarks/vllm_sync.py), published in bf16, committed and pushed to a directory remote each
step; a follower started at step 0 (``at=``, over a host copy, as the vLLM backend holds it)
updates to each commit, and each update's seconds are printed with whether the host copy
equals the trainer's bf16 weights bit for bit. The fetch is what a server does while it keeps
serving (download, decode, verify, write its host copy); vllm_sync.py adds the engine's write.

``--attach-at K``: at the end, a second follower starts mid-run from step K's weights
(``at=``, a cache of its own, as a server started later from a checkout of step K) and
updates to step K+1, then to the last step: its bytes and seconds against the first
follower's step K+1 (issue 65: it read the model, not a step). Then again lent the chunks of
a clone of the remote (``repository=``, as a server started from ``wvc checkout`` of step K in
a clone): it reads the step alone.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from .vllm_sync import MODELS


def shapes(spec: dict) -> dict:
    h, inter, kv = spec["hidden"], spec["inter"], spec["kv_heads"] * spec["hidden"] // spec["heads"]
    out = {"model.embed_tokens.weight": (spec["vocab"], h), "model.norm.weight": (h,)}
    if not spec["tied"]:
        out["lm_head.weight"] = (spec["vocab"], h)
    for layer in range(spec["layers"]):
        p = f"model.layers.{layer}."
        out.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                    p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                    p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (inter, h),
                    p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter),
                    p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    return out


def main(argv=None) -> None:
    import torch
    from safetensors.torch import save_file

    from wvc import Repo
    from wvc.read.follower import Follower

    from .cases import adam_step, init_weights

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="0.5b")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--attach-at", type=int, default=None)
    args = ap.parse_args(argv)
    if args.attach_at is not None and not 1 <= args.attach_at < args.steps:
        ap.error("--attach-at must be a step before the last (1 to --steps - 1)")
    master = init_weights(shapes(MODELS[args.model]), seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        train = Path(tmp) / "trainer"
        train.mkdir()

        def publish() -> dict:
            sd = {k: v.to(torch.bfloat16) for k, v in master.items()}
            save_file(sd, str(train / "model.safetensors"))
            return sd

        host = {k: v.clone() for k, v in publish().items()}
        repo = Repo.init(train)
        repo.remote_add("origin", str(Path(tmp) / "remote"))
        first = repo.commit("step 0").commit
        repo.push()
        follower = Follower(str(Path(tmp) / "remote"), "main", state_dict=host, at=first, patches=True)
        g = torch.Generator().manual_seed(1)
        seconds, commits, downloaded, attach_from = [], [first], [None], None
        for step in range(1, args.steps + 1):
            adam_step(master, g, 1e-6)
            now = publish()
            commit = repo.commit(f"step {step}").commit
            repo.push()
            t0 = time.perf_counter()
            update = follower.update(commit)
            seconds.append(time.perf_counter() - t0)
            commits.append(commit)
            downloaded.append(update.downloaded_bytes)
            if step == args.attach_at:
                attach_from = {k: v.clone() for k, v in now.items()}  # a checkout of step K
            exact = all(torch.equal(host[k].view(torch.int16), now[k].view(torch.int16)) for k in now)
            print(f"step {step}: fetch {seconds[-1]:.2f} s, {update.downloaded_bytes / 1e6:.2f} MB, exact {exact}",
                  flush=True)
            if not exact:
                raise SystemExit("the follower's copy differs from the trainer's weights")
        # (step 1's context, the version before step 0, was never held: it reads more)
        print(f"median fetch from step 2: {statistics.median(seconds[1:]):.2f} s")
        if attach_from is not None:
            attach(Path(tmp), {k: v.clone() for k, v in attach_from.items()}, commits, args.attach_at, downloaded, now)
            import wvc

            t0 = time.perf_counter()
            wvc.clone(str(Path(tmp) / "remote"), Path(tmp) / "clone")
            print(f"a clone of the remote (where a server's checkout of step {args.attach_at} comes from): "
                  f"{time.perf_counter() - t0:.2f} s")
            attach(Path(tmp), attach_from, commits, args.attach_at, downloaded, now, clone=Path(tmp) / "clone")


def attach(tmp: Path, held: dict, commits: list, k: int, downloaded: list, last: dict, clone=None) -> None:
    """A follower started at step ``k`` (``held``: its weights) moves to step k+1, then to the
    last; lent the chunks of ``clone`` where given."""
    import os

    import torch

    from wvc.read.follower import Follower

    os.environ["WVC_CACHE"] = str(tmp / ("attach-cache" if clone is None else "clone-cache"))  # (no catalog held)
    model = sum(v.numel() * v.element_size() for v in held.values())
    follower = Follower(str(tmp / "remote"), "main", state_dict=held, at=commits[k], patches=True, repository=clone)
    t0 = time.perf_counter()
    first = follower.update(commits[k + 1])
    first_s = time.perf_counter() - t0
    print(f"attached at step {k}{'' if clone is None else ', lent a clone':s}: its first update (to step {k + 1}) {first_s:.2f} s, "
          f"{first.downloaded_bytes / 1e6:.2f} MB (the follower along: {downloaded[k + 1] / 1e6:.2f} MB; "
          f"the model {model / 1e6:.0f} MB)", flush=True)
    if k + 1 < len(commits) - 1:
        t0 = time.perf_counter()
        then = follower.update(commits[-1])
        print(f"  then to step {len(commits) - 1}: {time.perf_counter() - t0:.2f} s, "
              f"{then.downloaded_bytes / 1e6:.2f} MB", flush=True)
    exact = all(torch.equal(held[n].view(torch.int16), last[n].view(torch.int16)) for n in last)
    print(f"  exact at the last step: {exact}")
    if not exact:
        raise SystemExit("the follower started mid-run differs from the trainer's weights")


if __name__ == "__main__":
    main()
