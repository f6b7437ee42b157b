"""The wvc benchmark: stored-bytes ratio, throughput and peak RSS, beside baselines.

    python -m benchmarks.run                 # every case, LLM-shaped model of 1 GB
    python -m benchmarks.run --llm-gb 4      # the memory check at 4 GB
    python -m benchmarks.run --quick         # skip the LLM-shaped model and the chain

Writes benchmarks/results/results.md, results.json and ratios.png. Every figure in a row is
measured in the same run on the same bytes; ratios are raw bytes / stored bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from wvc import Repo

from . import cases as C
from .baselines import BASELINES

RESULTS = Path(__file__).parent / "results"


class Child(NamedTuple):
    out: dict  # the command's JSON stdout, or {}
    wall: float  # seconds, the whole process
    rss: int  # ru_maxrss in bytes: an upper bound only (Linux counts the parent's pages at fork); wvc_op reports its own
    cpu: float  # user + system seconds of the process and its children
    user: float = 0.0  # user seconds alone: wvc's own work, without the kernel's (page-cache writes vary run to run)


def run_child(args: list[str], env: dict | None = None, cwd: str | None = None) -> Child:
    t = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{args} failed: {err[-2000:]}")
    parsed = json.loads(out) if out.strip().startswith("{") else {}
    return Child(parsed, wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, usage.ru_utime)


def wvc_op_args(*args) -> list[str]:
    return [sys.executable, "-m", "benchmarks.wvc_op", *map(str, args)]


def wvc_op(*args) -> Child:
    return run_child(wvc_op_args(*args))


def compile_bytecode() -> None:
    """Write wvc's bytecode, as ``pip install`` does for an installed package. Without it
    (``PYTHONDONTWRITEBYTECODE=1``, as on our CI machines, with an editable install) every
    timed process would first compile wvc's sources: ~30 ms that an installed wvc never pays."""
    import compileall

    import wvc

    for d in (Path(wvc.__file__).parent, Path(__file__).parent):
        compileall.compile_dir(str(d), quiet=2)


def startup_floor(runs: int = 7) -> dict:
    """What every wvc process pays before its work: the interpreter's start and the imports a
    commit and a checkout need (median of ``runs``)."""
    walls = sorted(wvc_op("startup").wall for _ in range(runs))
    return {"startup_s": walls[len(walls) // 2]}


def measure_case(case: C.Case, scratch: Path) -> dict:
    new = case.versions[-1] / "model.safetensors"
    base = case.versions[0] / "model.safetensors" if len(case.versions) > 1 else None
    raw = new.stat().st_size
    row = {"case": case.name, "group": case.group, "note": case.note, "raw_bytes": raw, "stored": {}}
    for label, fn in BASELINES.items():
        stored = fn(base, new)
        row["stored"][label] = stored

    repo_dir = scratch / "repo"
    shutil.rmtree(repo_dir, ignore_errors=True)
    Repo.init(repo_dir).close()
    for v in case.versions[:-1]:
        wvc_op("commit", repo_dir, v)
    os.sync()  # every timed step starts with no dirty pages: the disk here sustains ~250 MB/s
    committed = wvc_op("commit", repo_dir, case.versions[-1])
    res, wall, cpu = committed.out, committed.wall, committed.cpu
    # the whole directory is committed; count only the weights file for the ratio
    row["stored"]["wvc"] = res["stored_bytes"] - _side_files_cost(repo_dir, res["commit"])
    row["wvc_commit_s"] = wall  # the whole process, interpreter start included
    row["wvc_commit_inproc_s"] = res["seconds"]
    row["wvc_commit_rss"] = res["peak_rss_bytes"]
    row["wvc_commit_cpu_s"] = cpu
    out = scratch / "out"
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    checked_out = wvc_op("checkout", repo_dir, res["commit"], out)
    res2, wall2, cpu2 = checked_out.out, checked_out.wall, checked_out.cpu
    row["wvc_checkout_s"] = wall2
    row["wvc_checkout_inproc_s"] = res2["seconds"]
    row["wvc_checkout_rss"] = res2["peak_rss_bytes"]
    row["wvc_checkout_cpu_s"] = cpu2
    ok = (out / "model.safetensors").read_bytes() == new.read_bytes()
    row["byte_identical"] = ok
    # zstd CLI on the same file, same page-cache state
    zst = scratch / "new.zst"
    os.sync()
    z = run_child(["zstd", "-3", "-T2", "-q", "-f", str(new), "-o", str(zst)])
    os.sync()
    d = run_child(["zstd", "-d", "-q", "-f", str(zst), "-o", str(scratch / "new.dec")])
    # wvc's checkout makes the file durable (fsync before rename); zstd -d leaves it in the
    # page cache. The same decompression followed by an fsync of its output is the like-for-like figure.
    os.sync()
    ds = run_child(["sh", "-c", 'zstd -d -q -f "$0" -o "$1" && sync "$1"', str(zst), str(scratch / "new.dec")])
    row["zstd3_T2_s"], row["zstd3_T2_cpu_s"] = z.wall, z.cpu
    row["zstd_d_s"], row["zstd_d_cpu_s"] = d.wall, d.cpu
    row["zstd_d_fsync_s"] = ds.wall
    shutil.rmtree(out, ignore_errors=True)
    return row


def _side_files_cost(repo_dir: Path, commit: str) -> int:
    """Bytes the commit stored for files other than model.safetensors (config, tokenizer)."""
    with Repo.open(repo_dir) as repo:
        tree = repo.tree_of(commit)
        parent = repo.read_commit(commit).parents
        known = repo.tree_of(parent[0]).chunk_ids() if parent else set()
        total = 0
        for f in tree.files:
            if f.path == "model.safetensors":
                continue
            for c in set(f.chunk_ids()) - known:
                total += repo.internals.store.row(c).length
        return total


def chain_checkout(scratch: Path, commits: int = 50, max_chain: int | None = None) -> dict:
    """Checkout cost of commit N of a chain versus commit 1 (bounded delta chains)."""
    import torch

    shapes = C.llm_shapes(64e6, hidden=512, vocab=8000)
    master = C.init_weights(shapes, seed=11)
    g = torch.Generator().manual_seed(12)
    repo_dir = scratch / "chain"
    shutil.rmtree(repo_dir, ignore_errors=True)
    src = scratch / "chain-src"
    src.mkdir(exist_ok=True)
    repo = Repo.init(repo_dir, **({"max_chain": max_chain} if max_chain is not None else {}))
    ids, stored = [], 0
    t_commit = 0.0
    for i in range(commits):
        if i:
            C.adam_step(master, g, 1e-5)
        C._save(C.bf16(master), src)
        t = time.perf_counter()
        res = repo.commit(f"step {i}", source=src, allow_empty=True)
        t_commit += time.perf_counter() - t
        ids.append(res.commit)
        stored += res.stored_bytes
    depth = repo.internals.db.one("SELECT MAX(depth) FROM objects")
    repo.close()

    def best(rev):
        times = []
        for _ in range(3):
            out = scratch / "chain-out"
            shutil.rmtree(out, ignore_errors=True)
            times.append(wvc_op("checkout", repo_dir, rev, out).out["seconds"])
        return min(times)

    first, last = best(ids[0]), best(ids[-1])
    # re-anchoring cycles the depth: the worst checkout is somewhere in the last cycle
    worst = max(best(c) for c in ids[-(depth + 1):])
    raw = (src / "model.safetensors").stat().st_size
    return {"commits": commits, "raw_bytes_per_version": raw, "stored_total": stored, "max_depth": depth,
            "checkout_first_s": first, "checkout_last_s": last, "checkout_worst_s": worst,
            "ratio_last_first": last / first, "ratio_worst_first": worst / first,
            "commit_mean_s": t_commit / commits}


def markdown(rows: list[dict], chain: dict | None, meta: dict, floor: dict | None = None) -> str:
    labels = ["wvc"] + [k for k in BASELINES if k != "full copy (LFS/DVC)"]
    lines = ["# wvc benchmark results", "", f"{meta['when']} on {meta['machine']}; "
             f"ratio = raw bytes / stored bytes (higher is better); every column measured in the same run.", ""]
    lines.append("| case | raw MB | " + " | ".join(labels) + " | wvc / BitX |")
    lines.append("|---|---|" + "---|" * (len(labels) + 1))
    for r in rows:
        cells = []
        for k in labels:
            s = r["stored"].get(k)
            cells.append("-" if s is None else ("inf" if s == 0 else f"{r['raw_bytes'] / s:.2f}x"))
        bx, w = r["stored"]["BitX (ZipLLM)"], r["stored"]["wvc"]
        rel = f"{bx / w:.2f}" if w else "inf"
        lines.append(f"| {r['case']} | {r['raw_bytes'] / 1e6:.1f} | " + " | ".join(cells) + f" | {rel} |")
    lines += ["", "## Speed and memory", "",
              "MB/s of the model file; wall time of whole processes (interpreter start included), and in "
              "brackets wvc's time inside the process. Every timed step starts after a `sync` (no dirty pages "
              "left by the step before). wvc's checkout fsyncs what it writes, `zstd -d` does not: the "
              "`zstd -d + fsync` columns time the same decompression made durable.", "",
              "| case | wvc commit MB/s | zstd -3 -T2 MB/s | commit / zstd time | wvc checkout MB/s | zstd -d MB/s | checkout / zstd -d time | zstd -d + fsync MB/s | checkout / (zstd -d + fsync) time | commit peak RSS MB | checkout peak RSS MB | byte-identical |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mb = r["raw_bytes"] / 1e6
        lines.append(
            f"| {r['case']} | {mb / r['wvc_commit_s']:.0f} ({mb / r['wvc_commit_inproc_s']:.0f}) | {mb / r['zstd3_T2_s']:.0f} | {r['wvc_commit_s'] / r['zstd3_T2_s']:.2f} | "
            f"{mb / r['wvc_checkout_s']:.0f} ({mb / r['wvc_checkout_inproc_s']:.0f}) | {mb / r['zstd_d_s']:.0f} | {r['wvc_checkout_s'] / r['zstd_d_s']:.2f} | "
            f"{mb / r['zstd_d_fsync_s']:.0f} | {r['wvc_checkout_s'] / r['zstd_d_fsync_s']:.2f} | "
            f"{r['wvc_commit_rss'] / 1e6:.0f} | {r['wvc_checkout_rss'] / 1e6:.0f} | {'yes' if r['byte_identical'] else 'NO'} |"
        )
    lines += ["", "## What bounds the time: CPU", "",
              "CPU seconds (user + system) of the same whole processes, and the share of the wall time "
              "both cores were busy (CPU / (2 x wall)): how much of a time ratio above is work, and how "
              "much is waiting. Every wvc process first pays the interpreter's start and the imports"
              + (f" ({floor['startup_s']:.2f} s wall, `python -m benchmarks.wvc_op startup`, median of 7)" if floor else "")
              + "; the wvc timings run with wvc's bytecode compiled, as an installed package has it.", "",
              "| case | wvc commit CPU s | zstd -3 -T2 CPU s | commit / zstd CPU | commit cores busy | "
              "wvc checkout CPU s | zstd -d CPU s | checkout / zstd -d CPU | checkout cores busy |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "wvc_commit_cpu_s" not in r:
            continue
        lines.append(
            f"| {r['case']} | {r['wvc_commit_cpu_s']:.2f} | {r['zstd3_T2_cpu_s']:.2f} | {r['wvc_commit_cpu_s'] / r['zstd3_T2_cpu_s']:.2f} | "
            f"{r['wvc_commit_cpu_s'] / (2 * r['wvc_commit_s']):.0%} | {r['wvc_checkout_cpu_s']:.2f} | {r['zstd_d_cpu_s']:.2f} | "
            f"{r['wvc_checkout_cpu_s'] / r['zstd_d_cpu_s']:.2f} | {r['wvc_checkout_cpu_s'] / (2 * r['wvc_checkout_s']):.0%} |"
        )
    if chain:
        lines += ["", "## Delta chains", "",
                  f"{chain['commits']} commits of a {chain['raw_bytes_per_version'] / 1e6:.0f} MB bf16 model (Adam-like steps): "
                  f"{chain['stored_total'] / 1e6:.1f} MB stored for {chain['commits'] * chain['raw_bytes_per_version'] / 1e6:.0f} MB of versions; "
                  f"max chain depth {chain['max_depth']}; checkout of commit 1 {chain['checkout_first_s']:.2f} s, "
                  f"of commit {chain['commits']} {chain['checkout_last_s']:.2f} s (ratio {chain['ratio_last_first']:.2f}), "
                  f"slowest of the last {chain['max_depth'] + 1} commits {chain['checkout_worst_s']:.2f} s (ratio {chain['ratio_worst_first']:.2f}); "
                  f"mean commit {chain['commit_mean_s']:.2f} s."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["wvc", "BitX (ZipLLM)", "sparse idx+value (TRL)", "byte grouping (ZipNN idea)", "zstd-3 file", "CDC dedup (Xet-like)"]
    fig, ax = plt.subplots(figsize=(14, 6))
    width = 0.8 / len(labels)
    for i, k in enumerate(labels):
        vals = [min(r["raw_bytes"] / r["stored"][k], 1000) if r["stored"].get(k) else 1000 for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], vals, width, label=k)
    ax.set_yscale("log")
    ax.set_ylabel("raw / stored (log; capped at 1000)")
    ax.set_xticks([j + 0.4 for j in range(len(rows))])
    ax.set_xticklabels([r["case"] for r in rows], rotation=35, ha="right", fontsize=8)
    ax.legend(fontsize=8)
    ax.set_title("Stored-bytes ratio per case (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm-gb", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="skip the LLM-shaped model and the 50-commit chain")
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    compile_bytecode()
    # building the cases trains and saves models (minutes on a first run; cached after): say so
    print("preparing the cases (models are built once and cached in benchmarks/cache) ...", file=sys.stderr, flush=True)
    cases = C.all_cases(llm_gb=None if args.quick else args.llm_gb)
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    rows = []
    with tempfile.TemporaryDirectory(prefix="wvc-bench-", dir=os.environ.get("WVC_BENCH_SCRATCH")) as tmp:
        scratch = Path(tmp)
        for i, case in enumerate(cases, 1):
            t = time.time()
            print(f"[{i}/{len(cases)}] measuring {case.name} ...", file=sys.stderr, flush=True)
            row = measure_case(case, scratch)
            rows.append(row)
            w = row["raw_bytes"] / row["stored"]["wvc"] if row["stored"]["wvc"] else float("inf")
            b = row["raw_bytes"] / row["stored"]["BitX (ZipLLM)"]
            print(f"{case.name:<36} wvc {w:8.2f}x  BitX {b:7.2f}x  commit {row['wvc_commit_s']:.2f}s zstd {row['zstd3_T2_s']:.2f}s "
                  f"checkout {row['wvc_checkout_s']:.2f}s zstd-d {row['zstd_d_s']:.2f}s (+fsync {row['zstd_d_fsync_s']:.2f}s)  ({time.time() - t:.0f}s)", flush=True)
        chain = None if args.quick or args.only else chain_checkout(scratch)
        floor = startup_floor()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "python": platform.python_version()}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "cases": rows, "chain": chain, "startup": floor}, indent=1))
    (args.out / "results.md").write_text(markdown(rows, chain, meta, floor))
    plot(rows, args.out / "ratios.png")
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
