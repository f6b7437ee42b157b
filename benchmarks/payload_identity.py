"""Do two source trees of wvc store the same bytes? For refactors that must change no format.

    python -m benchmarks.payload_identity OTHER_TREE [--no-native]

Runs one scenario with each tree (``PYTHONPATH`` pointing at it, in a process of its own):
12 commits of bf16, fp32, fp8 and int8 tensors, a push to a directory remote (step records
included), a prune that re-encodes kept versions. Then compares every stored payload by id
and every tree id. Commit ids are not compared (they hold the commit time), nor pack names (a
prune's pack orders payloads as a set iterates, which differs from run to run).
Prints one JSON line; exits 1 when the trees differ. ``git worktree add /tmp/old <commit>``
makes the other tree (build its C kernels with ``python setup.py build_ext --inplace``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

SCENARIO = r'''
import hashlib, json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
import wvc

root = Path(sys.argv[1])
repo = wvc.Repo.init(root / "m", chunk_bytes=1 << 16)
g = torch.Generator().manual_seed(0)
w = torch.randn(300, 257, generator=g)
e = torch.randn(64, 64, generator=g)
for step in range(12):
    w = w + 1e-3 * torch.randn(w.shape, generator=g) * (torch.rand(w.shape, generator=g) < 0.3)
    e = e + 1e-2 * torch.randn(e.shape, generator=g)
    save_file({"w": w.to(torch.bfloat16), "f": w[:64].contiguous(), "e8": e.to(torch.float8_e4m3fn),
               "i": (e * 10).to(torch.int8)}, str(repo.root / "model.safetensors"))
    repo.commit(f"step {step}", metadata={"step": step})
repo.remote_add("origin", str(root / "remote"))
repo.push()
repo.prune(keep={"every": 4, "last": 2})
inner = getattr(repo, "internals", repo)  # (Repo was the Repository itself before issue 52)
payloads = {}
for (oid,) in inner.db.query("SELECT id FROM objects ORDER BY id"):
    row = inner.store.row(oid)
    payloads[oid] = [row.method, row.base, hashlib.sha256(bytes(inner.store.reader.read(row.pack, row.offset, row.length))).hexdigest()]
trees = sorted(inner.read_commit(entry.id).tree for entry in repo.log("main"))
print(json.dumps({"payloads": payloads, "trees": trees}))
'''


def run(tree: Path, no_native: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "WVC_AUTHOR": "bench@wvc"}
    if no_native:
        env["WVC_NO_NATIVE"] = "1"
    with tempfile.TemporaryDirectory(prefix="wvc-identity-") as tmp:
        out = subprocess.run([sys.executable, "-c", SCENARIO, tmp], env=env, cwd=tree, capture_output=True,
                             text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", type=Path, help="the other source tree (a checkout of another commit)")
    ap.add_argument("--no-native", action="store_true", help="the numpy path (WVC_NO_NATIVE=1) on both sides")
    args = ap.parse_args()
    mine, theirs = run(HERE, args.no_native), run(args.other.resolve(), args.no_native)
    differ = sorted(k for k in set(mine["payloads"]) | set(theirs["payloads"])
                    if mine["payloads"].get(k) != theirs["payloads"].get(k))
    same = not differ and mine["trees"] == theirs["trees"]
    print(json.dumps({"identical": same, "payloads": len(mine["payloads"]), "payloads_differing": len(differ),
                      "trees_identical": mine["trees"] == theirs["trees"], "native": not args.no_native}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
