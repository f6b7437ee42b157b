"""What `wvc ui` costs (issue 35): computing the change numbers for a history that lacks them,
against checking out each of its commits; and the change map's first view once they exist.

    python -m benchmarks.ui            # MiniLM: 10 real AdamW steps; synthetic: 200 commits x 100 tensors

Writes benchmarks/results/ui.json."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

import wvc
from wvc.ops.changes import ensure_changes, first_parent_history
from wvc.ui import server

RESULTS = Path(__file__).resolve().parent / "results"


def minilm_history(path: Path, steps: int):
    from tests.test_ui import _minilm_fine_tune

    return _minilm_fine_tune(path, steps)


def synthetic_history(path: Path, commits: int = 200, tensors: int = 100):
    repo = wvc.Repo.init(path, chunk_bytes=4096)
    g = torch.Generator().manual_seed(1)
    state = {f"model.layers.{i}.weight": torch.randn(64, generator=g) for i in range(tensors)}
    for step in range(commits):
        for i in (step % tensors, (7 * step) % tensors):
            state[f"model.layers.{i}.weight"] = state[f"model.layers.{i}.weight"] + 1e-3
        repo.commit(f"step {step}", state, metadata={"step": step, "loss": 1.0 / (step + 1)})
    return repo


def measure(repo, scratch: Path) -> dict:
    commits = first_parent_history(repo.internals, "HEAD")
    t = time.perf_counter()
    for c in commits:
        out = scratch / "out"
        repo.checkout(c, output=out, force=True)
        shutil.rmtree(out)
    checkout_s = time.perf_counter() - t
    t = time.perf_counter()
    ensure_changes(repo.internals, commits)
    changes_s = time.perf_counter() - t
    srv = server.Server(repo.internals, 0).start()
    try:
        t = time.perf_counter()
        page = urllib.request.urlopen(srv.url + "changes", timeout=300).read()
        first_view_s = time.perf_counter() - t
    finally:
        srv.shutdown()
        srv.server_close()
    return {"commits": len(commits), "checkout_every_commit_s": checkout_s, "compute_changes_s": changes_s,
            "changes_over_checkouts": changes_s / checkout_s, "change_map_first_view_s": first_view_s,
            "page_bytes": len(page)}


def main() -> None:
    out = {}
    with tempfile.TemporaryDirectory(prefix="wvc-ui-bench-") as tmp:
        tmp = Path(tmp)
        out["minilm_10_steps"] = measure(minilm_history(tmp / "minilm", 10), tmp)
        out["synthetic_200x100"] = measure(synthetic_history(tmp / "synthetic"), tmp)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ui.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
