"""Hostile values that used to crash a reader (issue 49, items 7 and 10): every test here
failed on main before its fix, with a traceback or a dropped connection."""

import json
import urllib.error
import urllib.request

import pytest
import torch

import wvc
from wvc.ui import server

from .test_everyday import run

HUGE = "1" + "0" * 400  # 401 digits: a valid JSON number no float can hold


def _history(tmp_path, n=4):
    repo = wvc.Repo.init(tmp_path / "run", chunk_bytes=1024)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(512, generator=g)
    for step in range(n):
        w = w + 1e-3 * torch.randn(512, generator=g)
        repo.commit(f"step {step}", {"w": w.clone()}, metadata={"step": step, "eval_loss": 1.0 / (step + 1)})
    return repo


def test_a_401_digit_metric_is_skipped_like_nan(tmp_path):
    repo = _history(tmp_path)
    (repo.root / "model.safetensors").unlink(missing_ok=True)
    r = run(repo.root, "commit", "--allow-empty", "-m", "huge", "--meta", "step=4", "--meta-json", f"eval_loss={HUGE}",
            check=False)
    assert r.returncode == 0, r.stderr
    huge = repo.resolve("HEAD")
    assert json.loads(json.dumps(repo.read_commit(huge).metadata["eval_loss"])) == int(HUGE)  # stored as given
    r = run(repo.root, "plot", "metrics", "-o", tmp_path / "m.svg", "--json", check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    points = json.loads(r.stdout)["data"]["series"]["eval_loss"]["main"]
    assert [x for x, _, _ in points] == [0, 1, 2, 3]  # the huge one skipped, the others drawn
    r = run(repo.root, "prune", "--keep-best", "eval_loss:min", "--json", check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    server.prepare(repo)
    srv = server.Server(repo, 0).start()
    try:
        with urllib.request.urlopen(srv.url + "metrics", timeout=30) as resp:
            assert resp.status == 200 and "eval_loss" in resp.read().decode()
    finally:
        srv.shutdown()
        srv.server_close()


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_web_view_answers_bad_requests_and_hangups_without_tracebacks(tmp_path, capfd):
    import socket

    repo = _history(tmp_path)
    server.prepare(repo)
    srv = server.Server(repo, 0).start()
    try:
        status, body = _status(srv.url + "changes?" + "&".join(f"f{k}=1" for k in range(60)))
        assert status == 400 and "Max number of fields" in body  # answered, not dropped
        for _ in range(5):  # clients that hang up before the answer
            with socket.create_connection(("127.0.0.1", srv.server_address[1])) as s:
                s.sendall(f"GET /changes HTTP/1.1\r\nHost: 127.0.0.1:{srv.server_address[1]}\r\n\r\n".encode())
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        assert _status(srv.url)[0] == 200  # (and the server still answers)
    finally:
        srv.shutdown()
        srv.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


def test_ui_options_out_of_range_and_empty_ranges_are_one_clear_line(tmp_path):
    repo = _history(tmp_path)
    for args, says in ((("--port", "99999"), "99999"), (("--limit", "0"), "--limit"),
                       (("--rev", "HEAD..HEAD"), "names no versions")):
        r = run(repo.root, "ui", "--no-browser", *args, check=False)
        assert r.returncode != 0 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        assert says in r.stderr and "no version here holds a tensor" not in r.stderr, r.stderr


def test_the_tensor_view_of_a_pruned_version_says_pruned_and_names_kept_ones(tmp_path):
    repo = _history(tmp_path, 6)
    log = [e.id for e in reversed(repo.log())]
    repo.prune(keep={"every": 3, "last": 1})
    assert repo.is_pruned(log[1])
    server.prepare(repo)
    srv = server.Server(repo, 0).start()
    try:
        status, body = _status(srv.url + f"tensor?commit={log[1]}&file=model.safetensors&tensor=w")
        assert status == 400 and "was pruned" in body and "nearest kept" in body and log[0][:12] in body, body
        assert "missing from the store" not in body
        assert not repo.is_pruned(log[3]) and repo.is_pruned(log[2])
        status, body = _status(srv.url + f"tensor?commit={log[3]}&file=model.safetensors&tensor=w")
        assert status == 400 and "parent" in body and "was pruned" in body, body  # kept, its parent gone
    finally:
        srv.shutdown()
        srv.server_close()


def _forge_place(repo, tensor: str, chunk: str):
    """A commit whose tree puts ``chunk`` (stored, of another length) at place 0 of ``tensor``,
    with a consistent file id: as a hostile remote could serve it."""
    import dataclasses
    import time

    from wvc.model.versions import Commit, Tree

    tree = repo.tree_of("HEAD")
    f = tree.files[0]
    t = next(t for t in f.tensors if t.name == tensor)
    forged = dataclasses.replace(t, chunks=(chunk, *t.chunks[1:]))
    entry = dataclasses.replace(f, tensors=tuple(forged if x.name == tensor else x for x in f.tensors)).with_content_id()
    new_tree = Tree((entry,), tree.chunk_bytes)
    head = repo.resolve("HEAD")
    commit = Commit(new_tree.id, (head,), "x", int(time.time()), "forged", {})
    repo.internals.record([(commit, new_tree, 0)], ref="refs/heads/main", expected=head, reason="forged")
    return commit.id


def test_a_follower_refuses_a_chunk_of_the_wrong_length_as_every_reader_does(tmp_path):
    """Issue 49, item 5."""
    from wvc.errors import CorruptObject

    repo = wvc.Repo.init(tmp_path / "r", chunk_bytes=4096)
    g = torch.Generator().manual_seed(0)
    repo.commit("one", {"w": torch.randn(4096, generator=g), "mid": torch.randn(500, generator=g),
                        "tiny": torch.tensor([7], dtype=torch.uint8)})
    follower = wvc.follow(str(repo.root))
    assert follower.update(timeout=5) is not None
    good = {k: v.clone() for k, v in follower.state_dict.items()}
    f = repo.tree_of("HEAD").files[0]
    for donor in ("tiny", "mid"):  # 1 byte, 2000 bytes, where place 0 of w holds 4096
        chunk = next(t for t in f.tensors if t.name == donor).chunks[0]
        forged = _forge_place(repo, "w", chunk)
        with pytest.raises(wvc.errors.WvcError):
            repo.checkout(forged, output=tmp_path / f"out-{donor}")  # (what checkout says, for comparison)
        with pytest.raises(CorruptObject, match="holds"):
            follower.update(timeout=5)
        assert all(torch.equal(follower.state_dict[k], good[k]) for k in good)  # nothing written
        repo.reset(follower.commit, mode="soft")
