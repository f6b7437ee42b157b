"""Speed in A/B pairs: wvc against zstd on the same bytes, run in turn, and on one core against two.

    python -m benchmarks.speed                    # the many-tensor case (minilm x8), 5 pairs
    python -m benchmarks.speed --pairs 9 --only "llm 1 GB bf16 step 0 -> 1" --llm-gb 1
    git worktree add /tmp/before REV && python -m benchmarks.speed --baseline /tmp/before   # a change, A/B
    # (the baseline table also has the operations' own in-process time and CPU, without the
    # interpreter's start; for a REV whose benchmarks/wvc_op.py predates cpu_seconds, copy
    # this tree's into the worktree to get the baseline's CPU too)

For each case: a delta commit of the case's last version onto a repository holding the one
before, against ``zstd -3 -T2`` of the same file; a checkout of that commit with ``--output``
against ``zstd -d`` of the same file (and ``zstd -d`` followed by an fsync of its output:
wvc's checkout makes its file durable, zstd does not). Each pair runs its two commands one
after the other on the same page-cache state (every step starts after a ``sync``; the order
flips from one pair to the next), and the figure quoted is the median over the pairs of the
per-pair ratio, so a machine whose speed
drifts during the run still compares like with like. Then the same wvc commit and checkout
pinned to one core and to two (``taskset``): the 2-core throughput over the 1-core one is
the parallel efficiency that says how far more cores would carry (zstd's own beside it).

Whole processes: the interpreter's start and the imports are in every wvc figure.
Writes benchmarks/results/speed.json and speed.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from wvc import Repo

from . import cases as C
from .run import RESULTS, compile_bytecode, run_child, wvc_op, wvc_op_args

DEFAULT_CASE = "minilm x8 bf16 step 0 -> 200"


def _timed(args: list[str], tree: Path | None = None) -> tuple:
    """(wall, CPU, in-process wall, in-process CPU, user CPU) of one process; the in-process
    two are what a wvc operation reports of itself (benchmarks/wvc_op.py: no interpreter
    start, which dilutes a change's effect on the whole process), None for zstd or a tree
    whose wvc_op does not report them; the user CPU leaves out the kernel's time, whose
    page-cache writes moved a checkout's CPU by a third from run to run here. ``tree``: run
    the wvc of that source tree instead."""
    os.sync()
    env = None
    if tree is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = str(tree)
    child = run_child(args, env=env, cwd=str(tree) if tree is not None else None)
    return child.wall, child.cpu, child.out.get("seconds"), child.out.get("cpu_seconds"), child.user


def _pin(cores: int | None, args: list[str]) -> list[str]:
    return args if cores is None else ["taskset", "-c", ",".join(map(str, range(cores))), *args]


def case_pairs(case: C.Case, scratch: Path, pairs: int, baseline: Path | None = None) -> dict:
    """Every figure of one case, over ``pairs`` A/B pairs; with ``baseline`` (another wvc
    source tree, e.g. a ``git worktree`` of an older commit) also its commit and checkout of
    the same bytes, paired with this tree's: the change measured against itself in one run."""
    new = case.versions[-1] / "model.safetensors"
    template, repo_dir, out = scratch / "template", scratch / "repo", scratch / "out"
    shutil.rmtree(template, ignore_errors=True)
    Repo.init(template).close()
    for v in case.versions[:-1]:
        wvc_op("commit", template, v)
    zst, dec = scratch / "new.zst", scratch / "new.dec"

    def fresh_repo():
        shutil.rmtree(repo_dir, ignore_errors=True)
        shutil.copytree(template, repo_dir)

    def commit(cores=None, tree=None):
        fresh_repo()
        return _timed(_pin(cores, wvc_op_args("commit", repo_dir, case.versions[-1])), tree)

    fresh_repo()
    commit_id = wvc_op("commit", repo_dir, case.versions[-1]).out["commit"]
    checked = scratch / "checked"
    shutil.rmtree(checked, ignore_errors=True)
    shutil.copytree(repo_dir, checked)

    def checkout(cores=None, tree=None):
        shutil.rmtree(out, ignore_errors=True)
        return _timed(_pin(cores, wvc_op_args("checkout", checked, commit_id, out)), tree)

    def zstd_c(cores=None):
        return _timed(_pin(cores, ["zstd", "-3", f"-T{cores or 2}", "-q", "-f", str(new), "-o", str(zst)]))

    def zstd_d(cores=None):
        return _timed(_pin(cores, ["zstd", "-d", "-q", "-f", str(zst), "-o", str(dec)]))

    def zstd_d_fsync():
        return _timed(["sh", "-c", 'zstd -d -q -f "$0" -o "$1" && sync "$1"', str(zst), str(dec)])

    zstd_c()
    checkout()  # warm: the repository's packs in the page cache, as for every timed step after it
    runs: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)  # (wall, CPU) per run

    def in_turn(k: int, *steps):
        """Run the (key, step) pairs, in reverse order on odd pairs: the first run of a pair
        was measurably slower or faster on this VM (writeback of the run before), and
        alternating takes that out of the ratios."""
        for key, step in (steps if k % 2 == 0 else steps[::-1]):
            runs[key].append(step())

    for k in range(pairs):
        in_turn(k, ("commit", commit), ("zstd3_T2", zstd_c))
        in_turn(k, ("checkout", checkout), ("zstd_d", zstd_d), ("zstd_d_fsync", zstd_d_fsync))
    if baseline is not None:
        for k in range(pairs):
            in_turn(k, ("commit_ab", commit), ("commit_baseline", lambda: commit(tree=baseline)))
            in_turn(k, ("checkout_ab", checkout), ("checkout_baseline", lambda: checkout(tree=baseline)))
    checkout()
    identical = (out / "model.safetensors").read_bytes() == new.read_bytes()
    for k in range(pairs):
        in_turn(k, ("commit_1core", lambda: commit(1)), ("commit_2core", lambda: commit(2)))
        in_turn(k, ("checkout_1core", lambda: checkout(1)), ("checkout_2core", lambda: checkout(2)))
        in_turn(k, ("zstd3_1core", lambda: zstd_c(1)), ("zstd3_2core", lambda: zstd_c(2)))
        in_turn(k, ("zstd_d_1core", lambda: zstd_d(1)), ("zstd_d_2core", lambda: zstd_d(2)))

    def med(key, k=0):
        return statistics.median(r[k] for r in runs[key])

    def per_pair(a, b, k=0):
        return [x[k] / y[k] for x, y in zip(runs[a], runs[b]) if x[k] is not None and y[k] is not None]

    def ratio(a, b, k=0):
        pairs = per_pair(a, b, k)
        return statistics.median(pairs) if pairs else None

    def spread(a, b, k=0):
        """The per-pair ratios' interquartile range: this machine's noise, beside the median
        (a change smaller than it needs more pairs to show)."""
        pairs = per_pair(a, b, k)
        return statistics.quantiles(pairs, n=4)[::2] if len(pairs) >= 4 else None

    raw = new.stat().st_size
    return {
        "case": case.name, "raw_bytes": raw, "pairs": pairs, "byte_identical": identical,
        "median_s": {k: med(k) for k in runs}, "median_cpu_s": {k: med(k, 1) for k in runs},
        "commit_over_zstd3_T2": ratio("commit", "zstd3_T2"), "commit_over_zstd3_T2_cpu": ratio("commit", "zstd3_T2", 1),
        "checkout_over_zstd_d": ratio("checkout", "zstd_d"), "checkout_over_zstd_d_cpu": ratio("checkout", "zstd_d", 1),
        "checkout_over_zstd_d_fsync": ratio("checkout", "zstd_d_fsync"),
        # throughput on 2 cores over 1 core = 1-core time over 2-core time, per pair
        "commit_2core_speedup": ratio("commit_1core", "commit_2core"),
        "checkout_2core_speedup": ratio("checkout_1core", "checkout_2core"),
        "zstd3_2core_speedup": ratio("zstd3_1core", "zstd3_2core"),
        "zstd_d_2core_speedup": ratio("zstd_d_1core", "zstd_d_2core"),
        "iqr": {"commit_over_zstd3_T2": spread("commit", "zstd3_T2"), "checkout_over_zstd_d": spread("checkout", "zstd_d"),
                "commit_2core_speedup": spread("commit_1core", "commit_2core"),
                "checkout_2core_speedup": spread("checkout_1core", "checkout_2core"),
                **({"commit_over_baseline_inproc": spread("commit_ab", "commit_baseline", 2),
                    "checkout_over_baseline_inproc": spread("checkout_ab", "checkout_baseline", 2),
                    "commit_over_baseline_user_cpu": spread("commit_ab", "commit_baseline", 4),
                    "checkout_over_baseline_user_cpu": spread("checkout_ab", "checkout_baseline", 4)}
                   if baseline is not None else {})},
        "runs": runs,
        **({"baseline": str(baseline),
            "commit_over_baseline": ratio("commit_ab", "commit_baseline"),
            "commit_over_baseline_cpu": ratio("commit_ab", "commit_baseline", 1),
            "checkout_over_baseline": ratio("checkout_ab", "checkout_baseline"),
            "checkout_over_baseline_cpu": ratio("checkout_ab", "checkout_baseline", 1),
            "commit_over_baseline_inproc": ratio("commit_ab", "commit_baseline", 2),
            "commit_over_baseline_inproc_cpu": ratio("commit_ab", "commit_baseline", 3),
            "checkout_over_baseline_inproc": ratio("checkout_ab", "checkout_baseline", 2),
            "checkout_over_baseline_inproc_cpu": ratio("checkout_ab", "checkout_baseline", 3),
            "commit_over_baseline_user_cpu": ratio("commit_ab", "commit_baseline", 4),
            "checkout_over_baseline_user_cpu": ratio("checkout_ab", "checkout_baseline", 4)}
           if baseline is not None else {}),
    }


def _with_iqr(r: dict, key: str) -> str:
    """A median ratio, and its pairs' interquartile range where there are enough pairs."""
    value, iqr = r.get(key), r.get("iqr", {}).get(key)
    if value is None:
        return "n/a"
    return f"{value:.2f} ({iqr[0]:.2f}-{iqr[1]:.2f})" if iqr else f"{value:.2f}"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# wvc speed in A/B pairs", "",
             f"{meta['when']} on {meta['machine']}, Python {meta['python']}. Whole processes (wvc's include "
             f"the interpreter's start, {meta['startup_s']:.2f} s here); each ratio is the median over the pairs "
             "of the ratio within a pair, with the interquartile range of those ratios in brackets (the "
             "machine's noise); times are medians. `python -m benchmarks.speed` reproduces it.", "",
             "| case | pairs | commit s | zstd -3 -T2 s | commit / zstd time | commit / zstd CPU | checkout s | "
             "zstd -d s | checkout / zstd -d time | checkout / zstd -d CPU | checkout / (zstd -d + fsync) time | "
             "byte-identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median_s"]
        lines.append(
            f"| {r['case']} | {r['pairs']} | {m['commit']:.2f} | {m['zstd3_T2']:.2f} | {_with_iqr(r, 'commit_over_zstd3_T2')} | "
            f"{r['commit_over_zstd3_T2_cpu']:.2f} | {m['checkout']:.2f} | {m['zstd_d']:.2f} | "
            f"{_with_iqr(r, 'checkout_over_zstd_d')} | {r['checkout_over_zstd_d_cpu']:.2f} | "
            f"{r['checkout_over_zstd_d_fsync']:.2f} | {'yes' if r['byte_identical'] else 'NO'} |")
    lines += ["", "## One core against two (`taskset`)", "",
              "Throughput on 2 cores over throughput on 1 (1-core time / 2-core time, median over pairs); "
              "zstd's figures are the same commands pinned the same way (`zstd -3 -T1` / `-T2`; `zstd -d` is "
              "single-threaded).", "",
              "| case | commit 1 core s | commit 2 cores s | commit 2-core speed-up | checkout 1 core s | "
              "checkout 2 cores s | checkout 2-core speed-up | zstd -3 speed-up | zstd -d speed-up |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["median_s"]
        lines.append(
            f"| {r['case']} | {m['commit_1core']:.2f} | {m['commit_2core']:.2f} | {_with_iqr(r, 'commit_2core_speedup')} | "
            f"{m['checkout_1core']:.2f} | {m['checkout_2core']:.2f} | {_with_iqr(r, 'checkout_2core_speedup')} | "
            f"{r['zstd3_2core_speedup']:.2f} | {r['zstd_d_2core_speedup']:.2f} |")
    based = [r for r in rows if "baseline" in r]
    if based:
        lines += ["", "## Against a baseline tree", "",
                  f"This tree's commit and checkout over those of `{based[0]['baseline']}` on the same bytes, in "
                  "A/B pairs of the same run (median of the per-pair ratio; below 1: faster now): whole processes, "
                  "and the operation's own time inside its process (no interpreter start; n/a where the "
                  "baseline's `benchmarks/wvc_op.py` does not report it).", "",
                  "| case | commit time | commit CPU | checkout time | checkout CPU | in process: commit time | "
                  "commit CPU | checkout time | checkout CPU | user CPU only: commit | checkout |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]

        def fmt(value):
            return "n/a" if value is None else f"{value:.3f}"

        columns = [f"{op}_over_baseline{where}{kind}" for where in ("", "_inproc") for op in ("commit", "checkout")
                   for kind in ("", "_cpu")] + ["commit_over_baseline_user_cpu", "checkout_over_baseline_user_cpu"]
        for r in based:
            lines.append(f"| {r['case']} | " + " | ".join(
                _with_iqr(r, c) if c in r.get("iqr", {}) else fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--only", action="append", help="a case name (repeatable); default: the many-tensor case")
    ap.add_argument("--llm-gb", type=float, default=None, help="build the LLM-shaped cases of this size too")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another wvc source tree (a git worktree of an older commit): its commit and "
                         "checkout paired with this tree's in the same run")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    compile_bytecode()
    wanted = args.only or [DEFAULT_CASE]
    cases = [c for c in C.all_cases(llm_gb=args.llm_gb) if c.name in wanted]
    if len(cases) != len(wanted):
        raise SystemExit(f"unknown case among {wanted}")
    from .run import startup_floor

    rows = []
    with tempfile.TemporaryDirectory(prefix="wvc-speed-", dir=os.environ.get("WVC_BENCH_SCRATCH")) as tmp:
        for case in cases:
            t = time.time()
            rows.append(case_pairs(case, Path(tmp), args.pairs, args.baseline and args.baseline.resolve()))
            r = rows[-1]
            print(f"{case.name}: commit/zstd-3-T2 {r['commit_over_zstd3_T2']:.2f}, checkout/zstd-d "
                  f"{r['checkout_over_zstd_d']:.2f}, 2-core speed-up commit {r['commit_2core_speedup']:.2f} "
                  f"checkout {r['checkout_2core_speedup']:.2f} ({time.time() - t:.0f} s)", flush=True)
        floor = startup_floor()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "python": platform.python_version(), **floor}
    (args.out / "speed.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=1))
    (args.out / "speed.md").write_text(markdown(rows, meta))
    print((args.out / "speed.md").read_text())


if __name__ == "__main__":
    main()
