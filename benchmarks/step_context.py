"""Issue #17: ULP_STEP, each step's delta coded in the context of the step before.

    python -m benchmarks.step_context [--steps 20] [--lr 1e-5 1e-6] [--out benchmarks/results/step_context.md]

A real bf16 AdamW run of all-MiniLM-L6-v2 (``benchmarks.sync``), every step kept. For each
step t >= 2 and each 4 MiB chunk of every float tensor it compares, in bytes:

- **best today**: the codec encoding step t against step t-1 without a context (the
  smallest of the methods before ULP_STEP wins: what wvc stored before this issue);
- **with ULP_STEP**: the same encode given step t-2 as the context (the writer's choice:
  ULP_STEP or today's best, whichever is smaller), whole payloads, headers included;
- **estimate**: the plug-in entropy of the delta (clipped to +-8 with an escape, escapes
  costed at 16 bits) given (the base's exponent, a class of the previous delta
  ``ordered(b) - ordered(g)``: 0, +1, +2..3, +>=4, -1, -2..-3, -<=-4), per chunk: the
  information the issue's table measured, without any model cost;
- **TRL sparse**: int32 indices + bf16 values of the changed elements in one safetensors
  file (``benchmarks.sync.trl_sparse_bytes``), over every tensor;
- **BitX**: ZipLLM's XOR + exponent / sign-mantissa split + zstd of the same step
  (``benchmarks.baselines.bitx``, over the step's safetensors files);
- encode and decode seconds of the chunks, with and without the context (same process,
  interleaved per chunk).

The medians are over the steps after the first five, as the issue asks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from wvc.codec import decode, encode
from wvc.codec.transforms import _ordered
from wvc.formats.dtypes import by_torch_dtype

from .baselines import bitx
from .sync import minilm_bf16_steps, trl_sparse_bytes

CHUNK = 4 << 20
RESULTS = Path(__file__).parent / "results"


def prev_class(p: np.ndarray) -> np.ndarray:
    a = np.abs(p)
    mag = np.where(a == 0, 0, np.where(a == 1, 1, np.where(a <= 3, 2, 3)))
    return np.where(p < 0, mag + 3, mag).astype(np.uint16) * (p != 0)


def estimate_bytes(x: np.ndarray, b: np.ndarray, g: np.ndarray) -> float:
    """The plug-in estimate (bytes) of x given base b and context g (bf16 bits as int16)."""
    ox, ob, og = (_ordered(v.astype(np.int32), 16) for v in (x, b, g))
    d = ox - ob
    exp = ((b.view(np.uint16) >> 7) & 0xFF).astype(np.uint16)
    key = prev_class(ob - og) * 256 + exp
    perm = np.argsort(key, kind="stable")
    clipped = np.clip(d, -9, 9)[perm]
    ks = key[perm]
    bits = 0.0
    for seg in np.split(np.arange(len(ks)), np.flatnonzero(np.diff(ks)) + 1):
        _, counts = np.unique(clipped[seg], return_counts=True)
        p = counts / counts.sum()
        bits += float(-(counts * np.log2(p)).sum())
        bits += 16.0 * int((np.abs(clipped[seg]) == 9).sum())
    return bits / 8


def timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-5, 1e-6])
    ap.add_argument("--out", type=Path, default=RESULTS / "step_context.md")
    args = ap.parse_args(argv)
    bf16 = by_torch_dtype(torch.bfloat16)
    lines = ["| lr | step | changed | best today KB | ULP_STEP KB | ratio | estimate KB | ULP_STEP / estimate "
             "| TRL sparse KB | TRL / ULP_STEP | BitX KB | encode s today / ULP_STEP | decode s today / ULP_STEP |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    from safetensors.torch import save_file

    files = Path(tempfile.mkdtemp(prefix="wvc-step-context-"))
    summary, rows = [], []
    for lr in args.lr:
        history: list[dict] = []
        kept = []
        for step, sd in minilm_bf16_steps(args.steps, lr=lr):
            history.append({k: v.detach().clone().contiguous() for k, v in sd.items()})
            history = history[-3:]
            save_file(history[-1], str(files / f"step{step % 2}.safetensors"))
            if step < 2:
                continue
            g, b, x = ({k: v.reshape(-1).view(torch.int16).numpy() for k, v in h.items() if v.dtype == torch.bfloat16}
                       for h in history)
            row = dict(lr=lr, step=step, today=0, step_bytes=0, estimate=0.0, enc=[0.0, 0.0], dec=[0.0, 0.0],
                       changed=0, elements=0, methods={})
            for name in x:
                for s in range(0, len(x[name]), CHUNK // 2):
                    xs, bs, gs = (h[name][s:s + CHUNK // 2].tobytes() for h in (x, b, g))
                    today, t0 = timed(encode, xs, bf16, bs)
                    stepped, t1 = timed(encode, xs, bf16, bs, context=gs)
                    back0, d0 = timed(decode, today.payload, len(xs), bs)
                    back1, d1 = timed(decode, stepped.payload, len(xs), bs, context=gs)
                    assert back0 == xs and back1 == xs  # lossless, byte for byte
                    row["today"] += len(today.payload)
                    row["step_bytes"] += len(stepped.payload)
                    row["methods"][stepped.method.name] = row["methods"].get(stepped.method.name, 0) + 1
                    row["enc"][0] += t0
                    row["enc"][1] += t1
                    row["dec"][0] += d0
                    row["dec"][1] += d1
                    xa, ba, ga = (np.frombuffer(v, dtype=np.int16) for v in (xs, bs, gs))
                    row["estimate"] += estimate_bytes(xa, ba, ga)
                    row["changed"] += int((xa != ba).sum())
                    row["elements"] += len(xa)
            row["trl"] = trl_sparse_bytes(history[1], history[2])[0]
            row["bitx"] = bitx(files / f"step{(step - 1) % 2}.safetensors", files / f"step{step % 2}.safetensors")
            rows.append(row)
            if step > 5:
                kept.append(row)
            lines.append(
                f"| {lr:g} | {step} | {row['changed'] / row['elements']:.2%} | {row['today'] / 1e3:.1f} "
                f"| {row['step_bytes'] / 1e3:.1f} | {row['step_bytes'] / row['today']:.3f} | {row['estimate'] / 1e3:.1f} "
                f"| {row['step_bytes'] / row['estimate']:.2f} | {row['trl'] / 1e3:.0f} | {row['trl'] / row['step_bytes']:.1f} "
                f"| {row['bitx'] / 1e3:.0f} "
                f"| {row['enc'][0]:.3f} / {row['enc'][1]:.3f} | {row['dec'][0]:.3f} / {row['dec'][1]:.3f} |")
            print(lines[-1], flush=True)
        med = statistics.median
        summary.append(
            f"lr {lr:g}, steps 6-{args.steps}: median ULP_STEP / best today {med(r['step_bytes'] / r['today'] for r in kept):.3f}; "
            f"ULP_STEP / estimate {med(r['step_bytes'] / r['estimate'] for r in kept):.2f}; "
            f"TRL sparse / ULP_STEP {med(r['trl'] / r['step_bytes'] for r in kept):.1f}; "
            f"encode time ULP_STEP / today {med(r['enc'][1] / r['enc'][0] for r in kept):.2f}; "
            f"decode time {med(r['dec'][1] / r['dec'][0] for r in kept):.2f}")
    shutil.rmtree(files, ignore_errors=True)
    text = "\n".join(lines + [""] + summary) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(summary))


if __name__ == "__main__":
    main()
