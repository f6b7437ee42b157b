"""Crash safety: SIGKILL at every write point of commit, checkout, gc, push and fetch.

After each kill: fsck is clean (leftovers allowed, and gc removes them), every commit that
was reported done still checks out byte-identically, and the interrupted operation
succeeds when rerun. Kills tried and failures are counted (target: 0 failures).
"""

import hashlib
import random
import time
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from wvc import Repo
from wvc.fsutil import TEMP_PREFIX

DRIVER = Path(__file__).parent / "crash_driver.py"
FUNCS = ("replace", "fsync", "unlink", "commit")
MAX_POINTS = 12  # per function and operation: bounds the run


def run(op, repo, arg=None, crash_at=None, timeout=120):
    cmd = [sys.executable, str(DRIVER), op, str(repo)] + ([str(arg)] if arg is not None else [])
    if crash_at:
        cmd += ["--crash-at", crash_at]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def digests(root: Path) -> dict:
    """The version's files (a killed checkout's temp file is garbage, not content)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())
            if p.is_file() and not p.name.startswith(TEMP_PREFIX)}


class World:
    """A repository, a path remote and a second clone; remembers what was reported done."""

    def __init__(self, tmp: Path):
        self.repo = Repo.init(tmp / "repo")
        self.repo.remote_add("origin", str(tmp / "remote"))
        self.other = Repo.init(tmp / "other")
        self.other.remote_add("origin", str(tmp / "remote"))
        self.done: dict[str, dict] = {}  # commit id -> file digests
        self.seed = 0

    def commit(self, crash_at=None):
        self.seed += 1
        r = run("commit", self.repo.root, self.seed, crash_at)
        if r.returncode == 0:
            commit = r.stdout.split()[-1]
            self.done[commit] = digests(self.repo.root)
        return r

    def check(self, where: str) -> list[str]:
        problems = []
        with Repo.open(self.repo.root) as repo:
            fsck = repo.fsck()
            problems += [f"{where}: fsck: {e}" for e in fsck.errors]
            for commit, expected in self.done.items():
                out = self.repo.root.parent / "verify"
                import shutil

                shutil.rmtree(out, ignore_errors=True)
                try:
                    repo.checkout(commit, output=out)
                    if digests(out) != expected:
                        problems.append(f"{where}: {commit[:12]} checks out different bytes")
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"{where}: {commit[:12]} no longer checks out: {exc}")
        return problems


@pytest.mark.slow
def test_sigkill_at_every_write_point(tmp_path):
    world = World(tmp_path)
    assert world.commit().returncode == 0
    assert run("push", world.repo.root).returncode == 0
    kills, failures = 0, []
    for op in ("commit", "checkout", "gc", "push", "fetch"):
        for func in FUNCS:
            for n in range(1, MAX_POINTS + 1):
                if op == "commit":
                    r = world.commit(crash_at=f"{func}:{n}")
                elif op == "checkout":
                    target = list(world.done)[n % len(world.done)]
                    r = run("checkout", world.repo.root, target, f"{func}:{n}")
                elif op == "gc":
                    r = run("gc", world.repo.root, None, f"{func}:{n}")
                elif op == "push":
                    world.commit()
                    r = run("push", world.repo.root, None, f"{func}:{n}")
                else:
                    r = run("fetch", world.other.root, None, f"{func}:{n}")
                if r.returncode == 0:
                    break  # this operation makes fewer than n such calls
                if r.returncode != -signal.SIGKILL:
                    failures.append(f"{op} {func}:{n} failed without being killed: {r.stderr[-500:]}")
                    break
                kills += 1
                failures += world.check(f"after kill in {op} at {func}:{n}")
                rerun = {"commit": lambda: world.commit(), "checkout": lambda: run("checkout", world.repo.root, "main"),
                         "gc": lambda: run("gc", world.repo.root), "push": lambda: run("push", world.repo.root),
                         "fetch": lambda: run("fetch", world.other.root)}[op]()
                if rerun.returncode != 0:
                    failures.append(f"rerun of {op} after {func}:{n} failed: {rerun.stderr[-500:]}")
    print(f"\ncrash points: {kills} kills, {len(failures)} failures")
    assert run("gc", world.repo.root).returncode == 0
    with Repo.open(world.repo.root) as repo:
        assert repo.fsck().leftovers == []  # gc removed every leftover of every kill
    (tmp_path.parent / "crash-summary.txt").write_text(f"{kills} kills, {len(failures)} failures\n")
    assert failures == []
    assert kills >= 15  # every operation was interrupted at several points


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path):
    """The same invariants with kills at random times (bounded: 12 kills)."""
    world = World(tmp_path)
    started = time.perf_counter()
    assert world.commit().returncode == 0
    took = time.perf_counter() - started  # kill moments are drawn within one commit's duration
    rng = random.Random(7)
    failures, kills = [], 0
    for i in range(12):
        world.seed += 1
        proc = subprocess.Popen([sys.executable, str(DRIVER), "commit", str(world.repo.root), str(world.seed)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, _ = proc.communicate(timeout=rng.uniform(0.15, 0.9) * took)  # the random moment
            if proc.returncode == 0:
                world.done[out.split()[-1]] = digests(world.repo.root)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills += 1
        failures += world.check(f"random kill {i}")
    assert world.commit().returncode == 0
    assert failures == []
    assert kills >= 3, f"only {kills} of 12 commits were killed: the test exercised too little"
