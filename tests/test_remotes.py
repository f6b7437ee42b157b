"""One conformance suite for every remote backend: a directory and a Hub repo (the local
Hub-compatible server, spoken to by the real huggingface_hub client)."""

import os
import json

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo, clone
from wvc.errors import CorruptObject, InvalidRefName, WvcError
from wvc.errors import NonFastForward, RemoteError

from .conftest import RemoteFiles, repo_state, tree_digests


pytestmark = pytest.mark.usefixtures("hub_env")


class Trainer:
    """A small bf16 model that moves a little at each step; commits and remembers digests."""

    def __init__(self, repo: Repo, seed: int = 0):
        self.repo = repo
        self.g = torch.Generator().manual_seed(seed)
        self.w = {f"layer{i}.weight": torch.randn(256, 256, generator=self.g) * 0.02 for i in range(3)}
        self.digests = {}

    def step_and_commit(self, msg="step"):
        for t in self.w.values():
            t += torch.randn(t.shape, generator=self.g) * 1e-4
        save_file({k: v.to(torch.bfloat16) for k, v in self.w.items()}, str(self.repo.root / "model.safetensors"))
        (self.repo.root / "config.json").write_text(json.dumps({"msg": msg}))
        res = self.repo.commit(msg)
        self.digests[res.commit] = tree_digests(self.repo.root)
        return res


def test_clone_checks_out_every_commit_byte_identically(tmp_path, remote_url):
    repo = Repo.init(tmp_path / "a")
    t = Trainer(repo)
    for i in range(3):
        t.step_and_commit(f"step {i}")
    repo.create_branch("exp", "HEAD~1")
    repo.remote_add("origin", remote_url)
    repo.push("origin", "main")
    repo.push("origin", "exp")
    copy = clone(remote_url, tmp_path / "b")
    assert set(copy.remote_branches()) == {"origin/main", "origin/exp"}
    for commit_id, digests in t.digests.items():
        copy.checkout(commit_id)
        assert tree_digests(copy.root) == digests
    assert copy.fsck().ok


def test_second_push_uploads_only_the_new_commit(tmp_path, remote_url):
    repo = Repo.init(tmp_path / "a")
    t = Trainer(repo)
    t.step_and_commit()
    repo.remote_add("origin", remote_url)
    first = repo.push()
    res = t.step_and_commit()
    second = repo.push()
    model_size = (repo.root / "model.safetensors").stat().st_size
    assert second.commits == 1
    assert second.uploaded_bytes < res.stored_bytes + 8_000  # + the commit, tree and pack index
    assert second.uploaded_bytes < model_size / 3 < first.uploaded_bytes
    assert repo.push().uploaded_bytes == 0  # nothing new


def test_concurrent_pushers_non_fast_forward_then_pull(tmp_path, remote_url):
    a = Repo.init(tmp_path / "a")
    ta = Trainer(a)
    ta.step_and_commit("base")
    a.remote_add("origin", remote_url)
    a.push()
    b = clone(remote_url, tmp_path / "b")
    tb = Trainer(b, seed=1)
    ta.step_and_commit("a's step")
    a.push()
    mine = tb.step_and_commit("b's step").commit
    before = repo_state(b.root)
    with pytest.raises(NonFastForward, match="not a fast-forward"):
        b.push()
    assert repo_state(b.root) == before  # lost nothing
    with pytest.raises(NonFastForward, match="diverged"):
        b.pull()
    from wvc.ops.merge import MergeConflict

    fetched = repo_state(b.root)  # the failed pull fetched: remote-tracking refs moved
    with pytest.raises(MergeConflict) as refused:  # both trained the same tensors: a rebase cannot pick
        b.pull(rebase=True)
    assert "model.safetensors:layer0.weight" in refused.value.conflicts
    assert repo_state(b.root) == fetched and b.log()[0].id == mine
    res = b.pull(merge=True, strategy="ours")
    assert res["merged"]
    assert [e.message for e in b.log()][1:] in (["b's step", "a's step", "base"], ["a's step", "b's step", "base"])
    assert tree_digests(b.root) == tb.digests[mine]  # b's weights, on top of a's history
    b.push()
    a.pull()
    assert a.log()[0].id == res["new"]
    assert tree_digests(a.root) == tb.digests[mine]


def test_force_push_overrides(tmp_path, remote_url):
    a = Repo.init(tmp_path / "a")
    Trainer(a).step_and_commit("a")
    a.remote_add("origin", remote_url)
    a.push()
    b = Repo.init(tmp_path / "b")
    Trainer(b, seed=5).step_and_commit("b, unrelated")
    b.remote_add("origin", remote_url)
    with pytest.raises(NonFastForward):
        b.push()
    assert b.push(force=True).forced
    c = clone(remote_url, tmp_path / "c")
    assert c.log()[0].message == "b, unrelated"


def test_interrupted_push_leaves_remote_refs_and_next_push_completes(tmp_path, remote_url, hub, monkeypatch):
    repo = Repo.init(tmp_path / "a")
    t = Trainer(repo)
    t.step_and_commit()
    repo.remote_add("origin", remote_url)
    repo.push()
    t.step_and_commit()

    def crash(*args, **kwargs):
        raise WvcError("simulated crash after the objects were uploaded")

    if remote_url.startswith("hf://"):
        hub.fail["commit"] = 1  # the server fails the atomic commit
    elif remote_url.startswith("s3://"):
        from wvc.remotes.s3 import S3Backend

        real_put = S3Backend._put
        monkeypatch.setattr(S3Backend, "_put", lambda self, path, *a, **k:
                            crash() if path.startswith("refs/") else real_put(self, path, *a, **k))
    else:
        from wvc.remotes.path import PathBackend

        real_lock = PathBackend._lock
        monkeypatch.setattr(PathBackend, "_lock", crash)
    with pytest.raises(WvcError):
        repo.push()
    if remote_url.startswith("s3://"):
        monkeypatch.setattr(S3Backend, "_put", real_put)
    elif not remote_url.startswith("hf://"):
        monkeypatch.setattr(PathBackend, "_lock", real_lock)
    other = clone(remote_url, tmp_path / "b")
    assert other.head() == repo.log()[1].id  # still the first commit
    repo.push()
    other.pull()
    assert other.head() == repo.head()


def test_corrupted_object_on_remote_is_detected_and_nothing_enters(tmp_path, remote_url, hub):
    repo = Repo.init(tmp_path / "a")
    t = Trainer(repo)
    t.step_and_commit()
    repo.remote_add("origin", remote_url)
    repo.push()
    files = RemoteFiles(remote_url, hub)
    pack = next(p for p in files.paths() if p.endswith(".pack"))
    data = bytearray(files.read(pack))
    data[len(data) // 2] ^= 0x01
    files.write(pack, bytes(data))
    target = Repo.init(tmp_path / "b")
    target.remote_add("origin", remote_url)
    before = repo_state(target.root)
    with pytest.raises(CorruptObject, match="pack"):
        target.fetch()
    assert repo_state(target.root) == before
    assert not list((target.root / ".wvc" / "packs").glob("pack-*"))


def _write_remote_file(remote_url, hub, path: str, data: bytes):
    RemoteFiles(remote_url, hub).write(path, data)


def pushed_and_empty(tmp_path, remote_url) -> tuple[Repo, Repo]:
    """A repository that pushed one commit to the remote, and an empty one set to fetch it."""
    repo = Repo.init(tmp_path / "a")
    Trainer(repo).step_and_commit()
    repo.remote_add("origin", remote_url)
    repo.push()
    target = Repo.init(tmp_path / "b")
    target.remote_add("origin", remote_url)
    return repo, target


def test_malicious_remotes_get_clear_errors_and_change_nothing(tmp_path, remote_url, hub):
    from wvc import ids
    from wvc.model.versions import Commit, canonical_json

    repo, target = pushed_and_empty(tmp_path, remote_url)

    def attempt(expected_error, match):
        before = repo_state(target.root)
        with pytest.raises(expected_error, match=match):
            target.fetch()
        assert repo_state(target.root) == before

    # a tree that would write outside the working tree, under a correctly hashed commit
    evil_tree = canonical_json({"format": 1, "chunk_bytes": 4194304, "files": [
        {"path": "../evil", "kind": "blob", "size": 0, "hash": "0" * 64, "chunks": []}]})
    tid = ids.digest(ids.TREE, evil_tree)
    commit = Commit(tid, (), "mallory", 0, "evil", {})
    _write_remote_file(remote_url, hub, f"objects/trees/{tid[:2]}/{tid}", evil_tree)
    _write_remote_file(remote_url, hub, f"objects/commits/{commit.id[:2]}/{commit.id}", commit.to_bytes())
    _write_remote_file(remote_url, hub, "refs/heads/evil", (commit.id + "\n").encode())
    attempt(CorruptObject, "corrupt")
    # a ref pointing to a commit that does not exist
    _write_remote_file(remote_url, hub, "refs/heads/evil", ("ab" * 32 + "\n").encode())
    attempt(RemoteError, "missing commit")
    # a ref name that is not a valid branch name
    _write_remote_file(remote_url, hub, "refs/heads/evil", repo.head().encode())
    _write_remote_file(remote_url, hub, "refs/heads/a..b", repo.head().encode())
    attempt(InvalidRefName, "invalid")


def test_bad_urls_and_unreachable_remotes_are_one_line_errors(tmp_path, monkeypatch, cli):
    r = cli(tmp_path, "clone", "ftp://example.org/x", "out")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "unsupported remote URL" in r.output
    r = cli(tmp_path, "clone", "hf://team/does-not-exist", "out")
    assert r.exit_code == 1 and "repository not found" in r.output
    monkeypatch.setenv("HF_TOKEN", "wrong")
    r = cli(tmp_path, "clone", "hf://team/does-not-exist", "out")
    assert r.exit_code == 1 and ("permission denied" in r.output or "not found" in r.output)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    r = cli(tmp_path, "clone", "hf://team/x", "out")
    assert r.exit_code == 1 and "cannot reach" in r.output
    r = cli(tmp_path, "clone", str(tmp_path / "no-such-dir"), "out")
    assert r.exit_code == 1 and "not a wvc remote" in r.output
    assert not (tmp_path / "out").exists()


def test_push_json_and_model_card(tmp_path, cli, hub):
    repo = Repo.init(tmp_path / "a")
    Trainer(repo).step_and_commit()
    assert cli(repo.root, "remote", "add", "origin", "hf://team/card").exit_code == 0
    out = json.loads(cli(repo.root, "push", "--json").output)
    assert out["uploaded_bytes"] > 0 and out["branch"] == "main"
    card = RemoteFiles("hf://team/card", hub).read("README.md").decode()
    assert "wvc clone hf://team/card" in card and "- `main`" in card
    meta = hub.storage.load("models", "team/card")
    assert meta["private"] is True
    listed = json.loads(cli(repo.root, "remote", "list", "--json").output)
    assert listed == {"remotes": {"origin": "hf://team/card"}}
    fetched = json.loads(cli(repo.root, "fetch", "--json").output)
    assert fetched["downloaded_bytes"] >= 0 and fetched["refs"] == {"main": out["new"]}


def test_truncated_pack_and_oversized_ref_are_refused(tmp_path, remote_url, hub):
    repo, target = pushed_and_empty(tmp_path, remote_url)
    before = repo_state(target.root)
    _write_remote_file(remote_url, hub, "refs/heads/huge", b"a" * 10_000)
    with pytest.raises(RemoteError):
        target.fetch()
    assert repo_state(target.root) == before
    _write_remote_file(remote_url, hub, "refs/heads/huge", repo.head().encode())
    files = RemoteFiles(remote_url, hub)
    pack = next(p for p in files.paths() if p.endswith(".pack"))
    files.write(pack, files.read(pack)[:-100])
    with pytest.raises(CorruptObject):
        target.fetch()
    assert repo_state(target.root) == before


def test_creating_a_hub_remote_changes_nothing_process_wide(monkeypatch):
    """A training script that pushes through wvc keeps its own huggingface_hub settings."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars

    from wvc.remotes import open_backend

    enable_progress_bars()
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    open_backend("hf://team/anything")
    assert not are_progress_bars_disabled()
    assert constants.HF_HUB_DISABLE_XET is False


def test_a_hub_error_on_a_path_with_404_in_it_is_not_taken_for_a_missing_file(hub):
    from wvc.remotes import open_backend
    from wvc.remotes.repository import read_state

    repo_remote = open_backend("hf://team/err404")
    read_state(repo_remote, create=True)
    from wvc.remotes.layout import handle_of

    path = "objects/trees/40/" + "404" + "a" * 61  # hex ids contain "404" about 1.5% of the time
    assert repo_remote.read(handle_of(path), 1 << 20) is None  # really missing: None
    _write_remote_file("hf://team/err404", hub, path, b"{}")
    repo_remote.listing()
    assert repo_remote.read(handle_of(path), 1 << 20) == b"{}"
    hub.fail["resolve"] = 1  # the next file read is refused (403)
    with pytest.raises(RemoteError, match="403"):
        repo_remote.read(handle_of(path), 1 << 20)


def test_stored_bytes_of_a_commit_are_the_same_however_it_arrived(tmp_path, remote_url):
    repo = Repo.init(tmp_path / "a")
    t = Trainer(repo)
    t.step_and_commit()
    t.step_and_commit()
    repo.remote_add("origin", remote_url)
    repo.push()
    other = clone(remote_url, tmp_path / "b")
    theirs = {e.id: e.stored_bytes for e in other.log()}
    assert theirs == {e.id: e.stored_bytes for e in repo.log()}
    assert all(v > 0 for v in theirs.values())
    # a rebase replays a commit onto new parents: it keeps the figure of the commit it replays
    (other.root / "extra.bin").write_bytes(os.urandom(100_000))  # a file upstream does not touch
    other.commit("step")
    mine = other.log()[0]
    t.step_and_commit()
    repo.push()
    other.pull(rebase=True)
    replayed = other.log()[0]
    assert replayed.id != mine.id and replayed.message == mine.message
    assert replayed.stored_bytes == mine.stored_bytes > 0
