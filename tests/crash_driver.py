"""Runs one wvc operation, SIGKILLing itself at a chosen write point (for test_crash.py).

    python tests/crash_driver.py OP REPO [ARG] [--crash-at FUNC:N]

FUNC is one of replace, fsync, unlink, commit (the SQLite COMMIT of a write transaction);
the process kills itself with SIGKILL just before the Nth such call. On success it prints
"DONE" and, for commit, the new commit id. Deterministic crash points reach every write
the operation makes, in order, without timing luck.
"""

import argparse
import contextlib
import os
import signal
import sys

import numpy as np
from safetensors.numpy import save_file

from wvc import Repo
from wvc.store import database

COUNTS: dict[str, int] = {}


def install(func: str, n: int) -> None:
    def trigger(name):
        COUNTS[name] = COUNTS.get(name, 0) + 1
        if name == func and COUNTS[name] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    for name in ("replace", "fsync", "unlink"):
        original = getattr(os, name)

        def hooked(*a, _orig=original, _name=name, **k):
            trigger(_name)
            return _orig(*a, **k)

        setattr(os, name, hooked)
    original_write = database.Database.write

    @contextlib.contextmanager
    def write(self):
        with original_write(self) as conn:
            yield conn
            trigger("commit")  # after the body, before SQLite's COMMIT

    database.Database.write = write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("repo")
    ap.add_argument("arg", nargs="?")
    ap.add_argument("--crash-at", default=None)
    args = ap.parse_args()
    if args.crash_at:
        func, n = args.crash_at.split(":")
        install(func, int(n))
    if args.op == "commit":
        repo = Repo.open(args.repo)
        rng = np.random.default_rng(int(args.arg))  # numpy: no torch import, fast restarts
        save_file({"w": (rng.standard_normal((64, 1024)) * 0.02).astype(np.float16),
                   "b": rng.standard_normal(300).astype(np.float32)}, str(repo.root / "model.safetensors"))
        (repo.root / "notes.txt").write_text(f"version {args.arg}\n")
        res = repo.commit(f"version {args.arg}")
        print("DONE", res.commit)
    elif args.op == "checkout":
        Repo.open(args.repo).checkout(args.arg, force=True)
        print("DONE")
    elif args.op == "gc":
        Repo.open(args.repo).gc(grace_seconds=0)
        print("DONE")
    elif args.op == "push":
        Repo.open(args.repo).push("origin", "main", force=False)
        print("DONE")
    elif args.op == "fetch":
        Repo.open(args.repo).fetch("origin")
        print("DONE")
    elif args.op == "prune":  # (tests/test_prune.py: every 10th step and the last 3 keep their weights)
        Repo.open(args.repo).prune(keep={"every": 10, "last": 3})
        print("DONE")
    else:
        sys.exit(f"unknown op {args.op}")


if __name__ == "__main__":
    main()
