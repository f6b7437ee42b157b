"""A probe for issue #17: how much does the previous step's delta predict this step's?

    python -m benchmarks.step_context [--steps 20] [--lr 1e-5 1e-6] [--out benchmarks/results/step_context.md]

A real bf16 AdamW run of all-MiniLM-L6-v2 (``benchmarks.sync``), every step kept. For each
step t >= 2 and each 4 MiB chunk of every float tensor it compares, in bytes:

- **best today**: wvc's codec encoding step t against step t-1 (the smallest method wins);
- **ULP + exponent + previous-delta groups** (the prototype): ULP_EXP's payload with the
  elements grouped by the base's exponent *and* a class of the previous delta
  ``ordered(b) - ordered(g)`` of the same element (0, +1, +2..3, +>=4, -1, -2..-3, -<=-4),
  which the decoder knows from steps t-1 and t-2: nothing extra is transmitted. Per group
  the byte planes are zstd'd as ULP_EXP's are (the same ``compress_stream``);
- **estimate**: the plug-in entropy of the delta (clipped to +-8 with an escape, escapes
  costed at 16 bits) given the same (exponent, previous-delta class) context, in bytes.

No format is changed: this measures what the grouping alone would give before building
the method (a new method id, the grandparent chunk on both sides, the follower keeping its
previous delta class).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch

from wvc.codec import encode
from wvc.codec.container import compress_stream
from wvc.codec.transforms import _ordered, _zigzag, merge_groups
from wvc.formats.dtypes import by_torch_dtype

from .sync import minilm_bf16_steps

CHUNK = 4 << 20
RESULTS = Path(__file__).parent / "results"


def prev_class(p: np.ndarray) -> np.ndarray:
    a = np.abs(p)
    mag = np.where(a == 0, 0, np.where(a == 1, 1, np.where(a <= 3, 2, 3)))
    return np.where(p < 0, mag + 3, mag).astype(np.uint16) * (p != 0)


def grouped_bytes(x: np.ndarray, b: np.ndarray, g: np.ndarray) -> tuple[int, float]:
    """(prototype payload bytes, estimate bytes) of x given base b and grandparent g."""
    ox, ob, og = (_ordered(v.astype(np.int32), 16) for v in (x, b, g))
    d = ox - ob
    y = _zigzag(d.astype(np.int16), 16)  # what ULP codes (wrapping int16, as the codec does)
    exp = ((b.view(np.uint16) >> 7) & 0xFF).astype(np.uint16)
    key = prev_class(ob - og) * 256 + exp
    perm = np.argsort(key, kind="stable")
    ys = y[perm]
    sizes = merge_groups(np.bincount(key, minlength=7 * 256).tolist())
    total, start = 0, 0
    for n in sizes:
        part = ys[start:start + n].view(np.uint8)
        for plane in (np.ascontiguousarray(part[0::2]), np.ascontiguousarray(part[1::2])):
            coder, _, data = compress_stream(plane, 1)
            total += len(data) + 8  # + a stream header's worth
        start += n
    # plug-in estimate per context of the clipped delta
    clipped = np.clip(d, -9, 9)
    bits = 0.0
    ks = key[perm]
    cs = clipped[perm]
    bounds = np.flatnonzero(np.diff(ks)) + 1
    for seg in np.split(np.arange(len(ks)), bounds):
        vals, counts = np.unique(cs[seg], return_counts=True)
        p = counts / counts.sum()
        bits += float(-(counts * np.log2(p)).sum())
        bits += 16.0 * int((np.abs(cs[seg]) == 9).sum())
    return total, bits / 8


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-5, 1e-6])
    ap.add_argument("--out", type=Path, default=RESULTS / "step_context.md")
    args = ap.parse_args(argv)
    bf16 = by_torch_dtype(torch.bfloat16)
    lines = ["| lr | step | best today KB | prototype KB | ratio | estimate KB | prototype / estimate |",
             "|---|---|---|---|---|---|---|"]
    summary = []
    for lr in args.lr:
        history: list[dict] = []
        ratios = []
        for step, sd in minilm_bf16_steps(args.steps, lr=lr):
            history.append({k: v.detach().clone().contiguous().reshape(-1).view(torch.int16).numpy()
                            for k, v in sd.items() if v.dtype == torch.bfloat16})
            history = history[-3:]
            if step < 2:
                continue
            g, b, x = history
            today = proto = est = 0.0
            for name in x:
                for s in range(0, len(x[name]), CHUNK // 2):
                    xs, bs, gs = (h[name][s:s + CHUNK // 2] for h in (x, b, g))
                    today += len(encode(xs.tobytes(), bf16, bs.tobytes()).payload)
                    p, e = grouped_bytes(xs, bs, gs)
                    proto += p
                    est += e
            ratio = proto / today
            if step > min(5, args.steps - 1):
                ratios.append((ratio, proto / est))
            lines.append(f"| {lr:g} | {step} | {today / 1e3:.1f} | {proto / 1e3:.1f} | {ratio:.3f} | {est / 1e3:.1f} "
                         f"| {proto / est:.2f} |")
            print(lines[-1], flush=True)
        summary.append(f"lr {lr:g}: median prototype / best today over steps 6-{args.steps}: "
                       f"{statistics.median(r for r, _ in ratios):.3f}; median prototype / estimate: "
                       f"{statistics.median(e for _, e in ratios):.2f}")
    text = "\n".join(lines + [""] + summary) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
