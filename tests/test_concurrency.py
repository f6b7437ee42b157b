"""Concurrency: committers, gc and pushers running at the same time never corrupt anything."""

import subprocess
import sys
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

from wvc import Repo, clone

COMMITTER = r"""
import sys, numpy as np
from pathlib import Path
from safetensors.numpy import save_file
from wvc import Repo
from wvc.errors import ConcurrentUpdate, WvcError
repo = Repo.open(sys.argv[1]); me = int(sys.argv[2]); src = Path(sys.argv[3])
src.mkdir(parents=True, exist_ok=True)
for k in range(int(sys.argv[4])):
    rng = np.random.default_rng(me * 100 + k)
    save_file({"w": rng.standard_normal((64, 256)).astype(np.float16)}, str(src / "model.safetensors"))
    for attempt in range(200):
        try:
            res = repo.commit(f"p{me}-{k}", source=src, branch="main", allow_empty=True)
            print(res.commit, flush=True)
            break
        except (ConcurrentUpdate, WvcError) as exc:  # lost the race, or the lock: retry
            if "moved" not in str(exc) and "locked" not in str(exc):
                raise
    else:
        sys.exit("gave up")
"""


def start_committers(repo_root, n_procs, per_proc, tmp):
    return [subprocess.Popen([sys.executable, "-c", COMMITTER, str(repo_root), str(i), str(tmp / f"src{i}"), str(per_proc)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n_procs)]


def test_parallel_committers_all_land_in_one_valid_chain(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    procs = start_committers(repo.root, 4, 3, tmp_path)
    reported = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-1000:]
        reported += out.split()
    log = repo.log("main")
    assert len(log) == 12 and {e.id for e in log} == set(reported)
    assert all(log[i].parents == (log[i + 1].id,) for i in range(len(log) - 1))  # a chain, nothing lost
    assert sorted(e.message for e in log) == sorted(f"p{i}-{k}" for i in range(4) for k in range(3))
    assert repo.fsck().ok


def test_gc_beside_commits_keeps_everything_reachable(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    src = tmp_path / "junk"
    src.mkdir()
    for k in range(3):  # unreachable history for gc to remove while commits run
        save_file({"w": np.random.default_rng(k).standard_normal((64, 256)).astype(np.float16)}, str(src / "model.safetensors"))
        repo.commit(f"junk {k}", source=src, branch="junk")
    repo.internals.db.conn.execute("UPDATE packs SET created_at = created_at - 7200")  # old enough to collect
    repo.commit("base", source=src, branch="main", allow_empty=True)
    repo.internals.refs.delete("refs/heads/junk", "test")
    procs = start_committers(repo.root, 2, 4, tmp_path)
    gcs = 0
    while any(p.poll() is None for p in procs):
        with Repo.open(repo.root) as other:
            other.gc(grace_seconds=3600)  # the default grace protects packs of running commits
        gcs += 1
    reported = []
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err[-1000:]
        reported += out.split()
    assert gcs >= 1
    assert repo.fsck().ok
    for i, commit in enumerate(reported):
        repo.checkout(commit, output=tmp_path / f"out{i}")
    assert not repo.internals.db.query("SELECT 1 FROM commits WHERE id IN (SELECT id FROM commits WHERE data LIKE '%junk%')")


@pytest.mark.parametrize("kind", ["path", "s3"])
def test_concurrent_pushers_to_one_branch(tmp_path, kind, request):
    from .conftest import push_until_landed, url_of

    remote = url_of(kind, tmp_path, request, "shared")
    seed = Repo.init(tmp_path / "seed")
    save_file({"w": np.zeros((64, 64), np.float16)}, str(seed.root / "model.safetensors"))
    seed.commit("base")
    seed.remote_add("origin", str(remote))
    seed.push()
    clients = [clone(str(remote), tmp_path / f"c{i}") for i in range(3)]
    errors, pushed = [], []

    def work(i, repo):
        try:
            for k in range(2):
                # each client trains its own file: every rebase applies cleanly, and every
                # client's last change must be at the final tip (none reverted by a rebase)
                save_file({"w": np.full((64, 64), i * 10 + k + 1, np.float16)}, str(repo.root / f"client{i}.safetensors"))
                repo.commit(f"c{i}-{k}")
                if push_until_landed(repo):
                    pushed.append(f"c{i}-{k}")
                else:
                    errors.append(f"client {i}: c{i}-{k} never got pushed in 1000 attempts")
        except Exception as exc:  # noqa: BLE001
            errors.append(f"client {i}: {exc!r}")

    threads = [threading.Thread(target=work, args=(i, Repo.open(c.root))) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    final = clone(str(remote), tmp_path / "final")
    messages = [e.message for e in final.log()]
    assert sorted(messages[:-1]) == sorted(f"c{i}-{k}" for i in range(3) for k in range(2))
    assert messages[-1] == "base"
    log = final.log()
    assert all(log[i].parents == (log[i + 1].id,) for i in range(len(log) - 1))
    assert final.fsck().ok
    from safetensors.numpy import load_file

    for i in range(3):
        assert (load_file(str(final.root / f"client{i}.safetensors"))["w"] == i * 10 + 2).all()
