"""What a run's remote holds at every sync, published with ``keep=`` against everything kept
(issue 65: "``keep=`` makes a run's remote smaller than keeping everything, at every point of
the run"; <= 0.9x over 20 syncs, <= 0.5x over 200 at the 75M model).

    python -m benchmarks.keep_growth [--model 75m] [--steps 200] [--out benchmarks/results/keep_growth_75m.json]

Two runs of the same steps (benchmarks/trl_sync.py's: the 75M Qwen2-shaped model's fp32
master moved by Adam-like steps at lr 1e-6, each step published as ``WvcWeightTransfer``
publishes it, into a directory remote, no server): one keeps every version, one prunes with
``keep="last=4,every=10"`` every 5 syncs (trl_sync.py's policy). After each sync: the bytes
under the remote, and the same less ``attic/`` (where a directory remote keeps retired files
for the grace period, an hour by default: readers that listed them before still find them).
Runs in the main environment (no vLLM).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from .dcp import dir_bytes
from .trl_sync import KEEP, _bf16
from .vllm_sync import MODELS, build

RESULTS = Path(__file__).parent / "results"


def _sizes(remote: Path) -> tuple[int, int]:
    """(everything under the remote, the same less its attic)."""
    total = dir_bytes(remote)
    attic = remote / "attic"
    return total, total - (dir_bytes(attic) if attic.is_dir() else 0)


def run(name: str, steps: int, work: Path, lr: float, keep: str | None) -> list[dict]:
    import torch
    from safetensors.torch import save_file

    from wvc.integrations.trl import WvcWeightTransfer

    from .cases import adam_step

    root = work / (f"{name}-keep" if keep else f"{name}-all")
    start = root / "start"
    master = build(start, MODELS[name])
    save_file(_bf16(master), str(start / "model.safetensors"), metadata={"format": "pt"})
    remote = root / "remote"
    options = {"keep": keep, "prune_every": 5} if keep else {}
    transfer = WvcWeightTransfer(str(remote), repo=root / "staging", start=start, **options)
    transfer.init_weight_transfer()
    g = torch.Generator().manual_seed(1)
    rows = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        adam_step(master, g, lr)
        transfer.publish(iter(master.items()), metadata={"step": step})
        total, live = _sizes(remote)
        rows.append({"step": step, "remote_bytes": total, "live_bytes": live})
        if step % 10 == 0:
            print(f"  {'keep' if keep else 'all '} sync {step}: {total / 1e6:.1f} MB ({live / 1e6:.1f} MB less the "
                  f"attic), {time.perf_counter() - t0:.0f} s", flush=True)
    transfer.destroy()
    return rows


def markdown(name: str, everything: list[dict], kept: list[dict]) -> str:
    lines = [f"keep='{KEEP}' (pruned every 5 syncs) against everything kept, {name}, directory remote: "
             "MB under the remote after the sync (less the attic), and the ratio.", "",
             "| sync | everything kept MB | keep= MB | keep= / everything | less the attic: everything kept MB "
             "| keep= MB | ratio |",
             "|---|---|---|---|---|---|---|"]
    marks = sorted({s for s in (1, 5, 10, 20, 50, 100, 150, 200, len(everything)) if s <= len(everything)})
    for s in marks:
        a, k = everything[s - 1], kept[s - 1]
        lines.append(f"| {s} | {a['remote_bytes'] / 1e6:.1f} | {k['remote_bytes'] / 1e6:.1f} | "
                     f"{k['remote_bytes'] / a['remote_bytes']:.2f}x | {a['live_bytes'] / 1e6:.1f} | {k['live_bytes'] / 1e6:.1f} | "
                     f"{k['live_bytes'] / a['live_bytes']:.2f}x |")
    worst = max(range(len(everything)), key=lambda i: kept[i]["live_bytes"] / everything[i]["live_bytes"])
    lines += ["", f"Largest ratio less the attic: {kept[worst]['live_bytes'] / everything[worst]['live_bytes']:.2f}x "
              f"at sync {worst + 1}; with the attic: "
              f"{max(k['remote_bytes'] / a['remote_bytes'] for a, k in zip(everything, kept)):.2f}x."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="75m", choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or RESULTS / f"keep_growth_{args.model}.json"
    with tempfile.TemporaryDirectory(prefix="wvc-keep-growth-") as tmp:
        everything = run(args.model, args.steps, Path(tmp), args.lr, None)
        kept = run(args.model, args.steps, Path(tmp), args.lr, KEEP)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "steps": args.steps, "lr": args.lr, "keep": KEEP,
                               "everything": everything, "kept": kept}, indent=1))
    text = markdown(args.model, everything, kept)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
