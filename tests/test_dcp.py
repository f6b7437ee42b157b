"""wvc as a torch.distributed.checkpoint storage layer: real multi-rank runs (gloo, CPU),
one process per rank (tests/dcp_worker.py)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from wvc import Repo

from .dcp_worker import full_tensors

ROOT = Path(__file__).resolve().parent.parent


def database_state(repo_path) -> str:
    """Everything the database records (the packs directory may gain orphans: leftovers)."""
    import hashlib
    import sqlite3

    conn = sqlite3.connect(Path(repo_path) / ".wvc" / "wvc.db")
    h = hashlib.sha256()
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
        for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1"):
            h.update(repr(row).encode())
    conn.close()
    return h.hexdigest()


def unchanged_but_leftovers(repo_path, before_db: str) -> None:
    """The repository as it was: same database, fsck clean; new files only leftovers gc removes."""
    assert database_state(repo_path) == before_db
    repo = Repo.open(repo_path)
    fsck = repo.fsck()
    assert fsck.ok and fsck.leftovers, (fsck.errors, fsck.leftovers)  # the sealed packs nothing refers to
    repo.gc(grace_seconds=0)
    assert not repo.fsck().leftovers and repo.fsck().ok


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ranks(world: int, args: dict, tmp_path, wait_for: int | None = None) -> tuple[list[int], list[dict]]:
    """Run ``world`` ranks; returns their exit codes and reports. ``wait_for``: a rank that
    is expected to die; the others are stopped once it has (they would wait for it)."""
    args = {**args, "out": str(tmp_path / f"report-{free_port()}")}
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.dcp_worker", str(r), str(world), str(port),
                               json.dumps(args)], env=env, cwd=ROOT) for r in range(world)]
    if wait_for is not None:
        procs[wait_for].wait(timeout=300)
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.wait(timeout=300) for p in procs]
    reports = []
    for r in range(world):
        path = Path(args["out"] + f".{r}.json")
        if path.exists():
            reports.append(json.loads(path.read_text()))
    return codes, reports


@pytest.mark.parametrize("world", [2, 4])
def test_three_saves_become_three_commits_that_load_at_any_world_size(tmp_path, world):
    repo_path = tmp_path / "ckpt"
    codes, reports = ranks(world, {"action": "save", "steps": [0, 1, 2], "repo": str(repo_path)}, tmp_path)
    assert codes == [0] * world
    commits = reports[0]["commits"]
    repo = Repo.open(repo_path)
    log = repo.log()
    assert [e.id for e in log] == commits[::-1] and [e.metadata["step"] for e in log] == [2, 1, 0]
    assert log[0].metadata["dcp"]["world_size"] == world
    first, second = log[2].stored_bytes, log[1].stored_bytes
    assert second < 0.4 * first, (first, second)
    assert repo.fsck().ok
    loads = [[commit, step] for step, commit in enumerate(commits)]
    for load_world in (1, 2, 3):  # 3: uneven shards of a save by 2 or 4
        codes, reports = ranks(load_world, {"action": "load", "source": str(repo_path), "loads": loads}, tmp_path)
        assert codes == [0] * load_world and len(reports) == load_world
        for r in reports:
            for (commit, step), done in zip(loads, r["loads"]):
                assert all(done["equal"].values()), (step, load_world, done)
                assert done["trainer"] == {"step": step, "note": f"saved at step {step}"}
    out = tmp_path / "export"
    res = repo.export(commits[-1], out, max_shard_bytes=20_000)
    assert len(res["shards"]) > 1 and (out / "model.safetensors.index.json").is_file()
    got = {}
    for shard in res["shards"]:
        got.update(load_file(str(out / shard)))
    expected = full_tensors(2)
    assert sorted(got) == sorted(expected)
    for name, t in expected.items():
        assert torch.equal(got[name].view(torch.int16), t.view(torch.int16)), name


def test_dcp_commits_diff_push_clone_and_gc_like_any_other(tmp_path):
    repo_path = tmp_path / "ckpt"
    assert ranks(2, {"action": "save", "steps": [0, 1], "repo": str(repo_path)}, tmp_path)[0] == [0, 0]
    repo = Repo.open(repo_path)
    diff = repo.diff("HEAD~1", "HEAD")
    changed = {t["name"] for t in diff["tensors"] if t["status"] == "modified"}
    assert "embed.weight@0,0" in changed and "embed.weight@48,0" in changed  # per tensor, across both ranks
    repo.remote_add("origin", str(tmp_path / "remote"))
    repo.push()
    other = tmp_path / "clone"
    from wvc import clone

    cloned = clone(str(tmp_path / "remote"), other, lazy=True)
    assert cloned.log()[0].id == repo.log()[0].id
    codes, reports = ranks(2, {"action": "load", "source": str(other), "step": 1}, tmp_path)
    assert codes == [0, 0] and all(all(r["equal"].values()) for r in reports)
    assert repo.gc(grace_seconds=0).commits_removed == 0 and repo.fsck().ok


@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_killed_while_writing_leaves_the_repository_unchanged(tmp_path, victim):
    repo_path = tmp_path / "ckpt"
    assert ranks(2, {"action": "save", "steps": [0], "repo": str(repo_path)}, tmp_path)[0] == [0, 0]
    before = database_state(repo_path)
    head = Repo.open(repo_path).log()[0].id
    codes, _ = ranks(2, {"action": "kill-write", "victim": victim, "steps": [1], "repo": str(repo_path)}, tmp_path,
                     wait_for=victim)
    assert codes[victim] == 9
    unchanged_but_leftovers(repo_path, before)
    repo = Repo.open(repo_path)
    assert repo.log()[0].id == head
    codes, reports = ranks(2, {"action": "save", "steps": [1], "repo": str(repo_path)}, tmp_path)
    assert codes == [0, 0] and Repo.open(repo_path).log()[0].id == reports[0]["commits"][0]
    codes, reports = ranks(2, {"action": "load", "source": str(repo_path), "step": 1}, tmp_path)
    assert all(all(r["equal"].values()) for r in reports)


def test_the_coordinator_killed_in_finish_leaves_the_repository_unchanged(tmp_path):
    repo_path = tmp_path / "ckpt"
    assert ranks(2, {"action": "save", "steps": [0], "repo": str(repo_path)}, tmp_path)[0] == [0, 0]
    before = database_state(repo_path)
    codes, _ = ranks(2, {"action": "kill-finish", "steps": [1], "repo": str(repo_path)}, tmp_path, wait_for=0)
    assert codes[0] == 9
    unchanged_but_leftovers(repo_path, before)
    codes, _ = ranks(2, {"action": "save", "steps": [1], "repo": str(repo_path)}, tmp_path)
    assert codes == [0, 0] and Repo.open(repo_path).log()[0].metadata["step"] == 1


def test_loading_from_a_hub_remote_downloads_about_one_copy_spread_over_ranks(tmp_path, hub_env):
    repo_path = tmp_path / "ckpt"
    assert ranks(2, {"action": "save", "steps": [0, 1], "repo": str(repo_path)}, tmp_path)[0] == [0, 0]
    repo = Repo.open(repo_path)
    url = f"hf://team/dcp-{tmp_path.name}"
    repo.remote_add("origin", url)
    repo.push()
    codes, reports = ranks(2, {"action": "load", "source": url, "rev": "main", "step": 1}, tmp_path)
    assert codes == [0, 0] and all(all(r["equal"].values()) for r in reports)
    per_rank = [r["downloaded_bytes"] for r in reports]
    # one copy of the commit: every chunk its tree names, with the delta bases it needs
    stored = sum(repo.internals.store.row(c).length for c in repo.tree_of("HEAD").chunk_ids())
    bases = {repo.internals.store.row(c).base for c in repo.tree_of("HEAD").chunk_ids()} - {None}
    one_copy = stored + sum(repo.internals.store.row(b).length for b in bases)
    assert sum(per_rank) <= 1.2 * one_copy + 64 * 1024, (per_rank, one_copy)
    assert min(per_rank) > 0.2 * sum(per_rank), per_rank  # each rank read about its share


def test_bytes_items_that_are_not_plain_data_are_refused_unless_trusted(tmp_path):
    import io

    from wvc.integrations.dcp import _check_plain

    buf = io.BytesIO()
    torch.save({"step": 3}, buf)
    _check_plain(buf.getvalue(), "ok")
    buf = io.BytesIO()
    torch.save(Path("/etc"), buf)  # an arbitrary class: unpickling it runs its constructor
    from wvc.errors import FormatError

    with pytest.raises(FormatError, match="trust_pickles"):
        _check_plain(buf.getvalue(), "trainer")
