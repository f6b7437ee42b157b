"""TRL-style weight syncs through wvc into a vLLM server: bytes and seconds per sync (issue 51).

    VENV=$(bash .ci/vllm-env)
    VENV/bin/python -m benchmarks.trl_sync [--models 75m 0.5b] [--steps 20] [--anchor-every 10]
                                           [--out benchmarks/results/trl_sync.json]

Runs in the vLLM environment. For each model (benchmarks/vllm_sync.py's: LLM-shaped Qwen2,
the 75M one untied, the 0.5B one tied like Qwen2.5-0.5B): an fp32 master (AsyncGRPO's
default training dtype) moved by AdamW-like steps at lr 1e-6 (GRPOConfig's default; the
real trainer does not run here at these sizes: tests_vllm/test_trl.py runs it on a tiny
model), each step synced the way ``WvcWeightTransfer.send_weights`` does it: the fp32
tensors streamed one at a time into a commit of the bf16 checkpoint, pushed to a directory
remote, and a real vLLM server (``wvc`` backend, CPU) told to load it.

Per sync: bytes wvc uploaded (the push), bytes a server fetches (a follower of the same
remote started at the same commit: the backend's follower makes the same reads), against
TRL's default transfer (the full bf16 model, over NCCL, every sync) and the delta-sync
encoding (6 bytes a changed element: int32 index + bf16 value; a full anchor every
``--anchor-every`` syncs); seconds to publish (commit + push) and for the server to load.
At the end: the server reports the last commit; what the remote holds, and what it holds
when the same run prunes with ``keep=`` (a second run of the same steps, publishing only).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from .dcp import dir_bytes
from .sync import _median
from .vllm_sync import MODELS, _rss, build

RESULTS = Path(__file__).parent / "results"
KEEP = "last=4,every=10"
# WvcWeightTransfer's keep_bytes (raw chunks kept as the next sync's delta bases: up to three
# host copies of the checkpoint). At 0.5B the default (2 GiB a set) does not fit a 24 GB machine
# beside this process's fp32 master, its mirror follower and the 7.5 GB vLLM server: 512 MiB.
KEEP_BYTES = {"0.5b": 512 << 20}


def _bf16(master: dict) -> dict:
    import torch

    return {k: v.to(torch.bfloat16) for k, v in master.items()}


def _changed(prev: dict, cur: dict) -> int:
    import torch

    return sum(int((prev[k].view(torch.int16) != cur[k].view(torch.int16)).sum()) for k in cur)


def run_model(name: str, spec: dict, steps: int, work: Path, lr: float, anchor_every: int) -> dict:
    from wvc.integrations.publisher import KEEP_BYTES as DEFAULT_KEEP_BYTES

    import torch
    from safetensors.torch import save_file

    import wvc
    from wvc.integrations.trl import WvcWeightTransfer

    from tests_vllm.engine import server

    from .cases import adam_step

    root = work / name
    start = root / "start"
    master = build(start, spec)
    save_file(_bf16(master), str(start / "model.safetensors"), metadata={"format": "pt"})
    params = sum(t.numel() for t in master.values())
    full = 2 * params
    print(f"{name}: {params / 1e6:.1f}M parameters, {full / 1e6:.0f} MB bf16", flush=True)
    remote = root / "remote"
    with server(start, root / "server.log", wvc_backend=True, remote=remote) as url:  # (a server's remote is its own setting)
        keep_bytes = KEEP_BYTES.get(name, DEFAULT_KEEP_BYTES)
        transfer = WvcWeightTransfer(str(remote), servers=[url], repo=root / "staging", start=start,
                                     keep_bytes=keep_bytes)
        t0 = time.perf_counter()
        transfer.init_weight_transfer()
        init_s = time.perf_counter() - t0
        follower = wvc.follow(str(remote), "main", state_dict=_bf16(master), at=transfer.start_commit, patches=True)
        g = torch.Generator().manual_seed(1)
        rows = []
        for step in range(1, steps + 1):
            adam_step(master, g, lr)
            t0 = time.perf_counter()
            commit = transfer.publish(iter(master.items()), metadata={"step": step})
            publish_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            transfer.notify()
            load_s = time.perf_counter() - t0
            cur = _bf16(master)
            changed = _changed(follower.state_dict, cur)  # against the version the server held
            up = follower.update(rev=commit)
            if not all(torch.equal(follower.state_dict[k].view(torch.int16), cur[k].view(torch.int16)) for k in cur):
                raise SystemExit(f"{name}: step {step}: the follower's weights differ from the trainer's")
            sync = transfer.syncs[-1]
            delta = full if step % anchor_every == 0 else 6 * changed
            del cur
            rows.append({"step": step, "changed": changed, "changed_share": changed / params,
                         "uploaded": sync["uploaded_bytes"], "downloaded": up.downloaded_bytes, "full": full,
                         "delta_sync": delta, "delta_sync_patch": 6 * changed, "publish_s": publish_s,
                         "commit_s": sync["commit_s"], "push_s": sync["push_s"], "load_s": load_s,
                         "trainer_rss": _rss("VmRSS")})
            print(f"  sync {step}: {changed / params:.1%} changed, up {sync['uploaded_bytes'] / 1e6:.2f} MB, "
                  f"down {up.downloaded_bytes / 1e6:.2f} MB, delta-sync {delta / 1e6:.2f} MB, "
                  f"publish {publish_s:.2f} s, load {load_s:.2f} s, trainer RSS {_rss('VmRSS') / 1e9:.2f} GB", flush=True)
        reported = transfer.servers[0].weight_version()
        if reported != commit:
            raise SystemExit(f"{name}: the server reports {reported}, not {commit}")
        transfer.destroy()
    del master, follower
    kept = _keep_run(root, start, build(root / "again", spec), steps, lr, keep_bytes)  # the same start weights (seed 0)
    return {"model": name, "spec": spec, "parameters": params, "model_bytes": full, "anchor_every": anchor_every,
            "keep_bytes": keep_bytes, "trainer_peak_rss": _rss("VmHWM"),
            "init_s": init_s, "init_uploaded": transfer.start_uploaded_bytes,
            "steps": rows, "remote_bytes": dir_bytes(remote), "kept": kept}


def _keep_run(root: Path, start: Path, master: dict, steps: int, lr: float, keep_bytes: int) -> dict:
    """The same steps published with ``keep=``: what the remote holds after."""
    import torch

    from wvc.integrations.trl import WvcWeightTransfer

    from .cases import adam_step

    remote = root / "remote-keep"
    transfer = WvcWeightTransfer(str(remote), repo=root / "staging-keep", start=start, keep=KEEP, prune_every=5,
                                 keep_bytes=keep_bytes)
    transfer.init_weight_transfer()
    g = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        adam_step(master, g, lr)
        transfer.publish(iter(master.items()), metadata={"step": step})
    transfer.destroy()
    return {"policy": KEEP, "remote_bytes": dir_bytes(remote), "prunes": transfer.prunes}


def markdown(results: list[dict]) -> str:
    lines = ["| model | changed / sync | wvc upload MB / sync | server download MB / sync | full model MB (TRL default) "
             "| delta-sync MB / sync (patch; with anchors) | wvc vs delta-sync | publish s | server load s "
             "| remote MB after (all kept; keep=) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        s = r["steps"]
        up, down = _median([x["uploaded"] for x in s]), _median([x["downloaded"] for x in s])
        patch = _median([x["delta_sync_patch"] for x in s])
        with_anchors = sum(x["delta_sync"] for x in s) / len(s)
        mean_up = sum(x["uploaded"] for x in s) / len(s)
        lines.append(
            f"| {r['parameters'] / 1e6:.0f}M {'tied' if r['spec']['tied'] else 'untied'} | "
            f"{_median([x['changed_share'] for x in s]):.1%} | {up / 1e6:.2f} | {down / 1e6:.2f} | "
            f"{r['model_bytes'] / 1e6:.0f} | {patch / 1e6:.2f}; {with_anchors / 1e6:.2f} | "
            f"{up / patch:.2f}x; {mean_up / with_anchors:.2f}x | {_median([x['publish_s'] for x in s]):.2f} | "
            f"{_median([x['load_s'] for x in s]):.2f} | {r['remote_bytes'] / 1e6:.0f}; "
            f"{r['kept']['remote_bytes'] / 1e6:.0f} |")
    lines.append("")
    lines.append(f"Medians over {len(results[0]['steps'])} syncs; 'with anchors': the mean when every "
                 f"{results[0]['anchor_every']}th sync is a full anchor, against wvc's mean upload. keep= "
                 f"'{KEEP}'. The remote also holds the start version, published once at init "
                 + ", ".join(f"({r['init_uploaded'] / 1e6:.0f} MB for {r['parameters'] / 1e6:.0f}M)" for r in results)
                 + ". Trainer process peak RSS (its fp32 master, a mirror follower, the staging repository's "
                 "kept chunks): " + ", ".join(f"{r['parameters'] / 1e6:.0f}M {r['trainer_peak_rss'] / 1e9:.1f} GB "
                                              f"(keep_bytes {r['keep_bytes'] >> 20} MiB)" for r in results) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--anchor-every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=RESULTS / "trl_sync.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wvc-trl-sync-") as tmp:
        os.environ.setdefault("WVC_CACHE", str(Path(tmp) / "cache"))
        results = [run_model(m, MODELS[m], args.steps, Path(tmp), args.lr, args.anchor_every) for m in args.models]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    table = markdown(results)
    args.out.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
