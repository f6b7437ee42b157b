"""Peak RSS of a clone against a checkout of the same model (architecture issue: a clone's
memory must not grow with the model).

A bf16 model of --mb MB (16 MiB tensors) is committed twice (the second an Adam-like step,
stored as deltas against the first), pushed to a directory remote, then, each in its own
process: ``wvc clone`` of the remote, and ``wvc checkout --output`` of the same version
from the source repository. Peak RSS is the child's ru_maxrss (VmHWM).

    python -m benchmarks.clone_memory [--mb 600]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


# Runs the CLI in a fresh interpreter and writes its VmHWM at exit. (A child's ru_maxrss from
# wait4 is no use here: Linux carries the parent's high-water mark across fork and exec.)
PROBE = """
import atexit, os, re, sys
def report():
    hwm = re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)
    open(os.environ["WVC_HWM_FILE"], "w").write(hwm)
atexit.register(report)
from wvc.cli import main
sys.argv = ["wvc", *sys.argv[1:]]
main()
"""


def peak_rss(args, cwd) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of one ``wvc ARGS`` process."""
    with tempfile.NamedTemporaryFile() as hwm:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env={**os.environ, "WVC_HWM_FILE": hwm.name})
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"wvc {args} failed: {done.stderr.decode()}")
        return int(Path(hwm.name).read_text()) * 1024, seconds


def build(root: Path, mb: int) -> None:
    import torch
    from safetensors.torch import save_file

    from wvc.api import Repo

    tensor_elems = 8 << 20  # 16 MiB of bf16
    g = torch.Generator().manual_seed(0)
    master = {f"layers.{i}.weight": torch.randn(tensor_elems, generator=g) * 0.02
              for i in range(max(1, (mb << 20) // (tensor_elems * 2)))}
    repo = Repo.init(root)
    for step in range(2):
        if step:
            for w in master.values():
                w -= 1e-4 * torch.randn(w.shape, generator=g).clamp(-3, 3)
        save_file({k: v.to(torch.bfloat16) for k, v in master.items()}, str(root / "model.safetensors"))
        repo.commit(f"step {step}")
    repo.close()


def measure(tmp: Path, mb: int) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    src, remote = tmp / "src", tmp / "remote"
    build(src, mb)
    wvc = [sys.executable, "-m", "wvc"]
    subprocess.run(wvc + ["remote", "add", "origin", str(remote)], cwd=src, check=True)
    subprocess.run(wvc + ["push"], cwd=src, check=True, stdout=subprocess.DEVNULL)
    clone_rss, clone_s = peak_rss(["clone", str(remote), str(tmp / "clone")], tmp)
    checkout_rss, checkout_s = peak_rss(["checkout", "main", "--output", str(tmp / "out")], src)
    same = (tmp / "clone" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    return {"model_mb": (src / "model.safetensors").stat().st_size / 1e6,
            "clone_peak_rss_mb": clone_rss / 1e6, "checkout_peak_rss_mb": checkout_rss / 1e6,
            "clone_over_checkout": clone_rss / checkout_rss, "clone_s": clone_s, "checkout_s": checkout_s,
            "byte_identical": same}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=600)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wvc-clone-mem-") as tmp:
        print(json.dumps(measure(Path(tmp), args.mb), indent=1))


if __name__ == "__main__":
    main()
