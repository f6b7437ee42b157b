"""Prune, gc and commits from separate processes (issue 49, item 1): every version that
was readable before stays byte-identical after, whatever lands in between.

The first four tests place one operation of another process exactly in the window where
the race did damage (tests/race_driver.py --hold: a barrier on a pipe, the processes real);
the stress test runs them side by side with no barrier, in random orders."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from race_driver import steps, version_digest  # noqa: E402

from wvc import Repo  # noqa: E402

DRIVER = Path(__file__).parent / "race_driver.py"


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), **extra}


def _run(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


def _start(*args, env=None, stdin=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DRIVER), *map(str, args)], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env())


def _wait_holding(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "HOLDING", (line, proc.stderr.read()[-2000:] if proc.poll() is not None else "")


def _release(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate("go\n", timeout=300)
    return proc.returncode, out, err


def _versions(out: str) -> dict[str, str]:
    return {d["commit"]: d["sha256"] for d in map(json.loads, (l for l in out.splitlines() if l.startswith("{")))}


def _run_of(tmp_path, n: int):
    root, state = tmp_path / "r", tmp_path / "state.safetensors"
    Repo.init(root).close()
    r = _run("steps", root, state, n)
    assert r.returncode == 0, r.stderr[-2000:]
    return root, state, _versions(r.stdout)


def _check(root, digests: dict[str, str]) -> None:
    """Every version of ``digests`` not pruned checks out byte-identical; fsck is clean."""
    with Repo.open(root) as repo:
        pruned = repo.pruned()
        for c, digest in digests.items():
            if c not in pruned:
                assert version_digest(repo, c) == digest, f"version {c[:12]} changed"
        assert repo.fsck().errors == []


def test_commits_landing_while_a_prune_writes_its_pack_stay_exact(tmp_path):
    root, state, digests = _run_of(tmp_path, 30)
    prune = _start("prune", root, "--keep", "every=10,last=1", "--hold")
    _wait_holding(prune)  # planned, pack written, not yet recorded
    r = _run("steps", root, state, 2)  # two more steps, on the tip's chunks the plan re-encodes
    assert r.returncode == 0, r.stderr[-2000:]
    new = _versions(r.stdout)
    digests.update(new)
    rc, out, err = _release(prune)
    assert rc == 0, err[-2000:]
    _check(root, digests)
    with Repo.open(root) as repo:
        assert not set(new) & repo.pruned()
        assert repo.pruned()  # the prune did run (again, seeing the new steps)


def _prune_with_a_step_during_every_plan(root, state, *options, plans: int = 4):
    """A prune held after each plan's pack, one training step committed in each hold (on the
    tip's chunks, which the plan re-encodes: their base is pruned). -> (exit code, stderr,
    how many plans it made, the new versions' digests)."""
    prune = _start("prune", root, "--keep", "last=1", "--hold", *options)  # holds after every plan's pack
    new = {}
    _wait_holding(prune)
    made = 0
    for made in range(1, plans + 1):
        r = _run("steps", root, state, 1)
        assert r.returncode == 0, r.stderr[-2000:]
        new.update(_versions(r.stdout))
        prune.stdin.write("go\n")
        prune.stdin.flush()
        if prune.stdout.readline().strip() != "HOLDING":
            break
    out, err = prune.communicate(timeout=300)
    return prune.returncode, err, made, new


@pytest.mark.parametrize("where", ["before the write lock", "under the write lock"])
def test_a_prune_finishes_while_training_commits_during_every_plan(tmp_path, where):
    """Training that commits every few seconds lands a step on the tip's chunks during every
    plan: the prune re-encodes what landed (before its write lock, and under it what lands
    meanwhile) instead of planning again, which would never end (it gave up after 3)."""
    root, state, digests = _run_of(tmp_path, 30)
    options = ("--unlocked-rounds", "0") if where == "under the write lock" else ()
    rc, err, plans, new = _prune_with_a_step_during_every_plan(root, state, *options)
    assert rc == 0, err[-2000:]
    assert plans == 1  # one plan: what landed meanwhile was re-encoded, not planned again
    locked = "re-encoded under the write lock" in err
    assert locked == (where == "under the write lock"), err[-2000:]  # (where the catch-up ran)
    digests.update(new)
    _check(root, digests)
    with Repo.open(root) as repo:
        assert not set(new) & repo.pruned()
        assert len(repo.pruned()) >= 29  # the run before the new step, less the tip it had
    assert not list((root / ".wvc").glob("*.tmp"))


def test_a_catch_up_larger_than_commits_may_wait_for_makes_the_plan_stale():
    """Under the write lock commits wait: a catch-up that would re-encode more than
    CATCH_UP_LOCKED_BYTES there raises StalePlan (the plan is made again; after 3 the prune
    refuses) before it writes anything; before the lock it has no such bound."""
    from types import SimpleNamespace

    from wvc.codec.container import Method
    from wvc.ops.prune import _catch_up
    from wvc.store.prune_plan import StalePlan
    from wvc.store.rows import ObjectRow

    rows = {"K": ObjectRow("K", "p", 0, 1, 4096, int(Method.PLANES), None, 0),
            "T": ObjectRow("T", "p", 0, 1, 4096, int(Method.XOR), "K", 1),
            "S": ObjectRow("S", "p", 0, 1, 4096, int(Method.STEP_BLOCKS), "T", 2)}  # recorded since the plan
    plan_rows = {"T": ObjectRow("T", "q", 0, 1, 4096, int(Method.PLANES), None, 0)}  # the plan made T a keyframe
    repo = SimpleNamespace(max_chain=8)
    written: list = []
    with pytest.raises(StalePlan, match="while commits wait"):
        _catch_up(repo, [], set(rows), dict(plan_rows), rows, {"T"}, written, locked_bytes=4095)
    assert written == []


def test_a_commit_encoded_before_a_prune_and_recorded_after_it_stays_exact(tmp_path):
    root, state, digests = _run_of(tmp_path, 30)
    commit = _start("steps", root, state, 2, "--hold")
    _wait_holding(commit)  # chunks encoded against the tip's chains as they were
    r = _run("prune", root, "--keep", "every=10,last=1")
    assert r.returncode == 0, r.stderr[-2000:]
    rc, out, err = _release(commit)
    assert rc == 0, err[-2000:]
    digests.update(_versions(out))
    assert len(_versions(out)) == 2
    _check(root, digests)


def test_two_prunes_with_different_policies_never_apply_a_stale_plan(tmp_path):
    root, state, digests = _run_of(tmp_path, 40)
    first = _start("prune", root, "--keep", "every=10,last=1", "--hold")
    _wait_holding(first)
    second = _run("prune", root, "--keep", "every=4,last=3", env=_env(WVC_LOCK_TIMEOUT="1"))
    rc, out, err = _release(first)
    assert rc == 0, err[-2000:]
    # the second waited for the first and then gave up, saying who holds the repository
    assert second.returncode == 3 and "wvc prune" in second.stderr, second.stderr[-2000:]
    _check(root, digests)
    again = _run("prune", root, "--keep", "every=4,last=3")
    assert again.returncode == 0, again.stderr[-2000:]
    _check(root, digests)


def test_gc_with_no_grace_never_deletes_a_running_prunes_pack(tmp_path):
    root, state, digests = _run_of(tmp_path, 30)
    prune = _start("prune", root, "--keep", "every=10,last=1", "--hold")
    _wait_holding(prune)
    packs = set((root / ".wvc" / "packs").glob("pack-*.pack"))
    gc = _run("gc", root, env=_env(WVC_LOCK_TIMEOUT="1"))
    assert gc.returncode == 3 and "wvc prune" in gc.stderr, gc.stderr[-2000:]
    assert set((root / ".wvc" / "packs").glob("pack-*.pack")) == packs  # nothing deleted
    rc, out, err = _release(prune)
    assert rc == 0, err[-2000:]
    _check(root, digests)
    assert _run("gc", root).returncode == 0
    _check(root, digests)


@pytest.mark.slow
def test_prune_gc_and_commits_in_random_interleavings_lose_nothing(tmp_path):
    root, state, digests = _run_of(tmp_path, 24)
    rng = random.Random(49)
    policies = ["every=10,last=1", "every=4,last=2", "every=3,last=1", "last=5"]
    for round_ in range(8):
        ops = [("steps", root, state, rng.randint(2, 4)), ("prune", root, "--keep", rng.choice(policies))]
        if rng.random() < 0.7:
            ops.append(("gc", root))
        rng.shuffle(ops)
        procs = [(op, _start(*op, stdin=subprocess.DEVNULL)) for op in ops]
        for op, proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"round {round_}, {op[0]}:\n{err[-3000:]}"
            if op[0] == "steps":
                digests.update(_versions(out))
        _check(root, digests)


def test_the_catch_up_moves_new_chunks_that_would_pass_max_chain_and_strips_steps_on_rebased_bases():
    """Under the write lock, for chunks recorded since the plan (max_chain 3): the plan put T
    on a new base (2 deep) and Q on B (3 deep). S, a step on T, keeps its base and loses its
    context (T's base changed); N, a plain delta on T, stays (3 deep). R on Q would be 4 deep:
    it goes on the first link of Q's chain with room (B), and P, a step on R, goes there too
    (on R it would be 4 deep). U, a step on an unmoved keyframe, stays."""
    from wvc.codec.container import Method
    from wvc.store.prune_plan import catch_up
    from wvc.store.rows import ObjectRow

    def row(oid, base, depth, method=Method.XOR):
        return ObjectRow(oid, "p", 0, 1, 1, int(method), base, depth)

    old = {"K": row("K", None, 0, Method.PLANES), "A": row("A", "K", 1), "B": row("B", "A", 2),
           "T": row("T", "K", 1), "Q": row("Q", "K", 1)}
    plan_rows = {"T": row("T", "A", 2), "Q": row("Q", "B", 3)}
    since = {"S": row("S", "T", 2, Method.ULP_STEP), "N": row("N", "T", 2), "R": row("R", "Q", 2),
             "P": row("P", "R", 3, Method.ULP_STEP), "U": row("U", "K", 1, Method.ULP_STEP)}
    rows = {**old, **since}
    fixes = catch_up({"T", "Q"}, set(rows), plan_rows, rows, max_chain=3)
    assert dict(fixes.items) == {"S": "T", "R": "B", "P": "B"}
    assert fixes.rebased == {"R", "P"}
    order = [o for o, _ in fixes.items]
    assert order.index("R") < order.index("P")  # bases first
