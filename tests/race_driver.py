"""One wvc operation in its own process, for the concurrency races of test_prune_races.py.

    python tests/race_driver.py steps REPO STATE N [--branch B]
    python tests/race_driver.py prune REPO --keep K [--hold] [--unlocked-rounds N] [--locked-bytes B]
    python tests/race_driver.py gc REPO

``steps`` continues a training-like run: it loads the run's tensors from STATE (a
safetensors file; created on first use), commits N versions from memory, saves the
tensors back, and prints one JSON line per version: {"commit": id, "sha256": digest}.
``--hold`` makes steps stop before its first version's record, and prune stop after its new pack is durable, before its transaction: it
prints HOLDING and waits for a line on stdin, so that another process's operation lands
exactly in that window (a barrier, not a sleep: the race is real, its timing chosen).
Each prints DONE (and a JSON result) on success; a WvcError exits 3 with its message.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from wvc import Repo
from wvc.errors import WvcError

sys.path.insert(0, str(Path(__file__).parent))  # (run as a script: the tests' folder)
from test_prune import version_digest  # noqa: E402  the digest the prune tests compare


def steps(repo, state: Path, n: int, branch: str) -> None:
    if state.exists():
        t = load_file(str(state))
        w, b, s = t["w"], t["b"], int(t["step"])
    else:
        g = torch.Generator().manual_seed(0)
        w, b, s = torch.randn(128, 256, generator=g).to(torch.bfloat16), torch.randn(300, generator=g), 0
    g = torch.Generator().manual_seed(1000 + s)
    for _ in range(n):
        idx = torch.randint(0, w.numel(), (w.numel() // 30,), generator=g)
        w.view(-1)[idx] += torch.randn(idx.numel(), generator=g).to(torch.bfloat16) * 1e-3
        b[s % 300] += 1e-3
        res = repo.commit(f"step {s}", source={"w": w.clone(), "b": b.clone()}, metadata={"step": s},
                          branch=branch)
        print(json.dumps({"commit": res.commit, "sha256": version_digest(repo, res.commit)}), flush=True)
        s += 1
    save_file({"w": w, "b": b, "step": torch.tensor(s)}, str(state))


def hold_after_pack() -> None:
    from wvc.store import prune_plan

    real = prune_plan.write_pack

    def held(*args, **kwargs):
        out = real(*args, **kwargs)
        print("HOLDING", flush=True)
        sys.stdin.readline()
        return out

    prune_plan.write_pack = held


def hold_before_record() -> None:
    """The first version's record waits (HOLDING, then a line on stdin): its chunks are
    encoded against the bases as they are now, and recorded after whatever runs meanwhile."""
    from wvc.repo import Repository

    real = Repository.record
    held = []

    def record(self, *args, **kwargs):
        if not held:
            held.append(True)
            print("HOLDING", flush=True)
            sys.stdin.readline()
        return real(self, *args, **kwargs)

    Repository.record = record


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("repo")
    ap.add_argument("rest", nargs="*")
    ap.add_argument("--branch", default="main")
    ap.add_argument("--keep", default="every=10,last=1")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--unlocked-rounds", type=int, default=None, help="prune: catch-ups before the write lock")
    ap.add_argument("--locked-bytes", type=int, default=None, help="prune: the most it re-encodes under the lock")
    args = ap.parse_args()
    from wvc.ops import prune as prune_op

    if args.unlocked_rounds is not None:
        prune_op.CATCH_UP_UNLOCKED_ROUNDS = args.unlocked_rounds
    if args.locked_bytes is not None:
        prune_op.CATCH_UP_LOCKED_BYTES = args.locked_bytes
    if args.op == "prune":  # what the prune did, for the tests to read on stderr
        import logging

        logging.basicConfig(stream=sys.stderr, format="%(name)s: %(message)s")
        logging.getLogger("wvc.ops.prune").setLevel(logging.DEBUG)
    try:
        with Repo.open(args.repo) as repo:
            if args.op == "steps":
                if args.hold:
                    hold_before_record()
                steps(repo, Path(args.rest[0]), int(args.rest[1]), args.branch)
                print("DONE", flush=True)
            elif args.op == "prune":
                if args.hold:
                    hold_after_pack()
                res = repo.prune(keep=args.keep)
                print("DONE", json.dumps({"pruned": res.pruned}), flush=True)
            elif args.op == "gc":
                repo.gc(grace_seconds=0)
                print("DONE", flush=True)
            else:
                raise SystemExit(f"unknown op {args.op}")
    except WvcError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
