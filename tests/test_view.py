"""wvc.open: lazy views of a version, local or remote; wvc cat."""

import torch
from safetensors.torch import save_file

import wvc
from wvc import Repo

import pytest

from .test_remotes import Trainer

pytestmark = pytest.mark.usefixtures("hub_env")


def test_remote_view_reads_one_tensor_without_the_model(tmp_path, remote_url, hub):
    repo = Repo.init(tmp_path / "a")
    t = Trainer(repo)
    for _ in range(3):
        t.step_and_commit()
    repo.remote_add("origin", remote_url)
    repo.push()
    view = wvc.open(remote_url, "main")
    assert view.files == ["config.json", "model.safetensors"]
    assert view.tensors["layer1.weight"] == ("BF16", (256, 256))
    before, fetched_before = hub.served_bytes, view._get.remote.bytes_downloaded
    w = view.tensor("layer1.weight")
    fetched = view._get.remote.bytes_downloaded - fetched_before
    local = repo.load_state_dict("main")
    assert torch.equal(w.view(torch.int16), local["layer1.weight"].view(torch.int16))
    # exactly the payloads of that tensor's chunks and of the delta bases they need
    index = view._get.index
    needed, stack = set(), list(view._entries["layer1.weight"].chunks)
    while stack:
        oid = stack.pop()
        if oid not in needed:
            needed.add(oid)
            stack += [index[oid][1].base] if index[oid][1].base else []
    payloads = sum(index[oid][1].length for oid in needed)
    assert fetched == payloads  # as the client counts, on every remote
    if remote_url.startswith("hf://"):  # and as the server counts
        assert hub.served_bytes - before == payloads < (repo.root / "model.safetensors").stat().st_size / 2
    full = view.state_dict()
    assert set(full) == set(local)
    assert view.read_file("model.safetensors") == (repo.root / "model.safetensors").read_bytes()


def test_local_view_and_cat(tmp_path, cli):
    repo = Repo.init(tmp_path / "m")
    save_file({"w": torch.randn(10, 10)}, str(repo.root / "model.safetensors"))
    (repo.root / "config.json").write_text('{"v": 1}')
    repo.commit("one")
    (repo.root / "config.json").write_text('{"v": 2}')
    repo.commit("two")
    assert wvc.open(repo.root, "HEAD~1").read_file("config.json") == b'{"v": 1}'
    r = cli(repo.root, "cat", "HEAD~1:config.json")
    assert r.exit_code == 0 and r.output == '{"v": 1}'
    r = cli(repo.root, "cat", "HEAD:model.safetensors", "-o", tmp_path / "copy.safetensors")
    assert (tmp_path / "copy.safetensors").read_bytes() == (repo.root / "model.safetensors").read_bytes()
    r = cli(repo.root, "cat", "HEAD:nope.txt")
    assert r.exit_code == 1 and "no file 'nope.txt'" in r.output
