"""Metadata at scale, by simulation (issue 36): many chunks per version from small chunks on a
small model (256-byte chunks: 250,000 chunks are 64 MB, a 405B model's chunk count at 4 MiB).
For each size: a first commit, then a step that changes 1% of the chunks; rows, tree bytes,
the step's catalog bytes on a directory remote, commit, push and clone times.

    python -m benchmarks.scale_chunks [--sizes 10000 50000 250000]

Writes benchmarks/results/scale_chunks.json and prints a table."""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

import torch

import wvc

RESULTS = Path(__file__).resolve().parent / "results"
CHUNK = 256


def one(n_chunks: int, scratch: Path) -> dict:
    elems = n_chunks * CHUNK // 4
    g = torch.Generator().manual_seed(0)
    w = torch.randn(elems, generator=g)
    repo = wvc.Repo.init(scratch / f"r{n_chunks}", chunk_bytes=CHUNK)
    t = time.perf_counter()
    repo.commit("first", {"w": w})
    first_s = time.perf_counter() - t
    step = w.clone()
    per_chunk = CHUNK // 4
    changed = torch.randperm(n_chunks, generator=g)[: max(1, n_chunks // 100)]
    for c in changed.tolist():
        step[c * per_chunk] += 1e-3
    t = time.perf_counter()
    res = repo.commit("step", {"w": step})
    step_s = time.perf_counter() - t
    db = sqlite3.connect(repo.root / ".wvc" / "wvc.db")
    rows = db.execute("SELECT COUNT(*) FROM objects").fetchone()[0]
    tree_bytes = db.execute("SELECT LENGTH(data) FROM trees WHERE id = ?", (res.tree,)).fetchone()[0]
    db.close()
    remote = scratch / f"remote{n_chunks}"
    repo.remote_add("origin", str(remote))
    repo.create_branch("first", "HEAD~1")
    repo.push("origin", "first")
    before = {p.name for p in (remote / "catalogs").iterdir()}
    t = time.perf_counter()
    repo.push("origin", "main")
    push_s = time.perf_counter() - t
    new = [p for p in (remote / "catalogs").iterdir() if p.name not in before]
    t = time.perf_counter()
    wvc.clone(str(remote), scratch / f"c{n_chunks}")
    clone_s = time.perf_counter() - t
    return {"chunks_per_version": n_chunks, "changed_chunks": len(changed), "object_rows": rows,
            "tree_bytes": tree_bytes, "step_catalog_bytes": sum(p.stat().st_size for p in new),
            "step_stored_bytes": res.stored_bytes, "first_commit_s": first_s, "step_commit_s": step_s,
            "step_push_s": push_s, "clone_s": clone_s}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 250_000])
    args = ap.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory(prefix="wvc-scale-") as tmp:
        for n in args.sizes:
            out.append(one(n, Path(tmp)))
            print(json.dumps(out[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale_chunks.json").write_text(json.dumps(out, indent=1))
    keys = list(out[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in out:
        print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")


if __name__ == "__main__":
    main()
