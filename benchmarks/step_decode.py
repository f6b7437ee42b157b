"""Issue 53: a step link's decode against a keyframe's, per chunk and along a whole chain.

    python -m benchmarks.step_decode [--real-steps 8] [--chain-steps 40] [--repeats 15]

Three measures, each with ULP_STEP and STEP_BLOCKS (what the encoder wrote before) and
STEP_RUNS (what it writes now) on the same bytes, every decode checked byte for byte:

- **links, real** (and each coder's encode time, the median of a third as many repeats):
  all-MiniLM-L6-v2 in bf16 under AdamW (benchmarks.long_run.real_steps,
  lr 1e-5); for each step t >= 3, the model's bytes in 4 MiB chunks, each coded as a step
  (base t-1, context t-2) and as a keyframe (PLANES, what a keyframe chunk is stored as);
  per chunk the median decode time of each over ``--repeats``, summed over the model.
- **links, synthetic**: the same for an 8 MB bf16 model moved as long_run's calibration says
  (2.6% of the elements changed a step, most of them again the way they moved before).
- **chain**: ``--chain-steps`` synthetic steps committed to a repository (max_chain 8: the
  tip sits up to 8 links above its keyframe), then the tip's checkout and its load into
  memory (``Repo.load_state_dict``) against step 0's (a keyframe version of the same model),
  median over ``--repeats``; once with each coder (``transforms.STEP_CODER``), and once as wvc
  writes (STEP_RUNS or STEP_BLOCKS, chosen by the step).

Figures from a shared machine drift: every ratio compares timings taken in turn in one run.
Writes benchmarks/results/step_decode.json and step_decode.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from wvc import codec
from wvc.codec import Method, transforms
from wvc.formats.dtypes import DTYPES

from .long_run import RESULTS, digest, real_steps, synthetic_steps

CHUNK = 4 << 20
BF16 = DTYPES["BF16"]
CODERS = (Method.ULP_STEP, Method.STEP_BLOCKS, Method.STEP_RUNS)


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _flat(state) -> bytes:
    return b"".join(state[k].detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for k in sorted(state))


def links(versions: list[bytes], repeats: int) -> list[dict]:
    """Per step t >= 2 of ``versions`` (flat model bytes): bytes and decode seconds of each coder
    and of a keyframe, summed over the model's 4 MiB chunks."""
    rows = []
    for t in range(2, len(versions)):
        x, b, g = versions[t], versions[t - 1], versions[t - 2]
        row = {"step": t, "changed": 0, "elements": len(x) // 2, "keyframe_bytes": 0, "keyframe_s": 0.0,
               **{f"{m.name}_bytes": 0 for m in CODERS}, **{f"{m.name}_s": 0.0 for m in CODERS},
               **{f"{m.name}_encode_s": 0.0 for m in CODERS}}
        for at in range(0, len(x), CHUNK):
            xc, bc, gc = x[at:at + CHUNK], b[at:at + CHUNK], g[at:at + CHUNK]
            row["changed"] += int((torch.frombuffer(bytearray(xc), dtype=torch.int16)
                                   != torch.frombuffer(bytearray(bc), dtype=torch.int16)).sum())
            key = codec.encode(xc, BF16).payload
            assert codec.decode(key, len(xc)) == xc
            row["keyframe_bytes"] += len(key)
            row["keyframe_s"] += _median_s(lambda: codec.decode(key, len(xc)), repeats)
            for m in CODERS:
                p = codec.encode(xc, BF16, bc, context=gc, method=m).payload
                row[f"{m.name}_encode_s"] += _median_s(lambda: codec.encode(xc, BF16, bc, context=gc, method=m),
                                                       max(3, repeats // 3))
                assert codec.decode(p, len(xc), bc, context=gc) == xc
                row[f"{m.name}_bytes"] += len(p)
                row[f"{m.name}_s"] += _median_s(lambda: codec.decode(p, len(xc), bc, context=gc), repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def chain(steps: int, mb: float, cal: dict, repeats: int, work: Path) -> dict:
    """The tip's checkout and load against step 0's, with each coder writing the steps."""
    from wvc import Repo

    out, writing = {}, transforms.STEP_CODER
    for m in (Method.ULP_STEP, Method.STEP_BLOCKS, Method.STEP_RUNS, None):
        transforms.STEP_CODER = m  # None: what wvc writes (STEP_RUNS or STEP_BLOCKS by the step)
        name = m.name if m is not None else "chosen"
        repo = Repo.init(work / name)
        commits, wanted = [], []
        for _, state in synthetic_steps(steps, mb, cal, seed=2):
            commits.append(repo.commit("step", source=state).commit)
            wanted.append(digest(state))
        by_method = repo.internals.store.bytes_by_method()
        methods = {Method(k).name: n for k, (n, _) in by_method.items()}
        tree = repo.internals.read_tree(repo.read_commit(commits[-1]).tree)
        depth = max(r.depth for r in repo.internals.store.rows(tree.chunk_ids()).values())
        res = {"methods": methods, "tip_depth": depth, "stored_bytes": sum(b for _, b in by_method.values())}
        for which, commit, want in (("first", commits[0], wanted[0]), ("tip", commits[-1], wanted[-1])):
            dest = work / "co"

            def checkout():
                shutil.rmtree(dest, ignore_errors=True)
                repo.checkout(commit, output=dest)

            res[f"checkout_{which}_s"] = _median_s(checkout, repeats)
            res[f"load_{which}_s"] = _median_s(lambda: repo.load_state_dict(commit), repeats)
            assert digest(repo.load_state_dict(commit)) == want
        res["checkout_tip_over_first"] = res["checkout_tip_s"] / res["checkout_first_s"]
        res["load_tip_over_first"] = res["load_tip_s"] / res["load_first_s"]
        repo.close()
        out[name] = res
        print(json.dumps({name: res}), flush=True)
    transforms.STEP_CODER = writing
    return out


def _link_lines(name: str, rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        per = " ".join(f"| {r[f'{m.name}_s'] * 1e3:.1f} | {r[f'{m.name}_s'] / r['keyframe_s']:.2f} "
                       f"| {r[f'{m.name}_bytes'] / 1e3:.1f}" for m in CODERS)
        lines.append(f"| {name} | {r['step']} | {100 * r['changed'] / r['elements']:.2f}% | {r['keyframe_s'] * 1e3:.1f} "
                     f"{per} | {r['STEP_RUNS_bytes'] / r['STEP_BLOCKS_bytes']:.3f} "
                     f"| {r['STEP_RUNS_encode_s'] / r['STEP_BLOCKS_encode_s']:.2f} |")
    return lines


def markdown(results: dict) -> str:
    heads = " ".join(f"| {m.name} ms | {m.name} / keyframe | {m.name} KB" for m in CODERS)
    lines = ["# Step links against keyframes (`python -m benchmarks.step_decode`)", "",
             "Per step: decode milliseconds over the model's 4 MiB chunks (median per chunk), a link's "
             "decode over a keyframe decode of the same chunks, and the links' bytes; every decode "
             "byte-identical.", "",
             f"| run | step | changed | keyframe ms {heads} | bytes STEP_RUNS / STEP_BLOCKS "
             "| encode time STEP_RUNS / STEP_BLOCKS |",
             "|" + "---|" * (6 + 3 * len(CODERS))]
    for name in ("real", "synthetic"):
        lines += _link_lines(name, results.get(name, []))
    if "chain" in results:
        c = results["chain"]
        lines += ["", f"Chain: {results['chain_steps']} synthetic steps committed, the tip against step 0 "
                  "(a keyframe version), median seconds:", "",
                  "| coder | tip depth | methods stored | stored KB | checkout tip / step 0 | load tip / step 0 "
                  "| checkout step 0 s | checkout tip s |", "|" + "---|" * 8]
        for m, r in c.items():
            lines.append(f"| {m} | {r['tip_depth']} | {r['methods']} | {r['stored_bytes'] / 1e3:.1f} "
                         f"| {r['checkout_tip_over_first']:.2f} | {r['load_tip_over_first']:.2f} "
                         f"| {r['checkout_first_s']:.3f} | {r['checkout_tip_s']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-steps", type=int, default=8)
    ap.add_argument("--synthetic-steps", type=int, default=6)
    ap.add_argument("--synthetic-mb", type=float, default=8.0)
    ap.add_argument("--chain-steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=RESULTS / "step_decode.json")
    args = ap.parse_args(argv)
    cal = json.loads((RESULTS / "long_run_1000.json").read_text())["runs"]["synthetic"]["calibration"]
    results = {"chain_steps": args.chain_steps, "calibration": cal}
    if args.real_steps:
        versions = [_flat(s) for _, s in real_steps(args.real_steps)]
        results["real"] = links(versions, args.repeats)
    if args.synthetic_steps:
        versions = [_flat(s) for _, s in synthetic_steps(args.synthetic_steps, args.synthetic_mb, cal, seed=1)]
        results["synthetic"] = links(versions, args.repeats)
    if args.chain_steps:
        work = Path(tempfile.mkdtemp(prefix="wvc-step-decode-"))
        try:
            results["chain"] = chain(args.chain_steps, args.synthetic_mb, cal, args.repeats, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
