"""Peak RSS of commit and checkout of a large model (default 4 GB bf16): streaming by
chunk means it should not grow with the model.

    python -m benchmarks.memory [--gb 4]
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from wvc import Repo

from . import cases as C
from .run import wvc_op


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=4.0)
    args = ap.parse_args(argv)
    versions = C.llm_bf16(args.gb, steps=1)
    with tempfile.TemporaryDirectory(prefix="wvc-mem-", dir=C.CACHE) as tmp:
        repo = Path(tmp) / "repo"
        Repo.init(repo).close()
        first = wvc_op("commit", repo, versions[0]).out
        second = wvc_op("commit", repo, versions[1]).out
        out = Path(tmp) / "out"
        checkout = wvc_op("checkout", repo, second["commit"], out).out
        same = (out / "model.safetensors").read_bytes() == (versions[1] / "model.safetensors").read_bytes()
        shutil.rmtree(out)
    report = {"model_gb": (versions[1] / "model.safetensors").stat().st_size / 1e9,
              "first_commit_peak_rss_mb": first["peak_rss_bytes"] / 1e6,
              "delta_commit_peak_rss_mb": second["peak_rss_bytes"] / 1e6,
              "checkout_peak_rss_mb": checkout["peak_rss_bytes"] / 1e6,
              "delta_commit_s": second["seconds"], "checkout_s": checkout["seconds"], "byte_identical": same}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
