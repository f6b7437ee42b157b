"""A commit from a stream of (name, tensor) pairs (``wvc.TensorStream``: what a trainer's
weight-sync iterator yields, one gathered parameter at a time) records what a commit of the
same weights as a state dict records, keeps the parent's file layout (shards, frozen tensors),
never holds two streamed tensors at once, and refuses a stream that does not fit the parent
before anything is recorded."""

import gc
import json
import weakref

import pytest
import torch
from safetensors.torch import save_file

import wvc
from wvc.errors import InvalidArgument


def _weights(seed: int, dtype=torch.bfloat16) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"layer.{i}.weight": torch.randn(96, 80, generator=g).to(dtype) for i in range(4)} | {
        "embed.weight": torch.randn(50, 80, generator=g).to(dtype)}


def _nudged(sd: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: (v.float() + 1e-2 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in sd.items()}


def test_a_streamed_commit_records_the_tree_a_state_dict_commit_records(tmp_path):
    start = _weights(0)
    a, b = wvc.Repo.init(tmp_path / "a"), wvc.Repo.init(tmp_path / "b")
    for repo in (a, b):
        (repo.root / "config.json").write_text('{"model_type": "toy"}')
        save_file(start, str(repo.root / "model.safetensors"))
        repo.commit("start")
    step = _nudged(start, 1)
    by_dict = a.commit("step 1", step)
    by_stream = b.commit("step 1", wvc.TensorStream(iter(step.items())))
    assert by_stream.tree == by_dict.tree  # the same files, byte for byte
    out = tmp_path / "out"
    b.checkout(by_stream.commit, output=out)
    want = tmp_path / "want.safetensors"
    save_file(step, str(want))
    assert (out / "model.safetensors").read_bytes() == want.read_bytes()
    assert (out / "config.json").read_text() == '{"model_type": "toy"}'


def test_streamed_fp32_is_cast_to_the_checkpoint_dtype_and_left_out_tensors_stay(tmp_path):
    start = _weights(0)
    repo = wvc.Repo.init(tmp_path / "r")
    save_file(start, str(repo.root / "model.safetensors"))
    repo.commit("start")
    master = {k: v.float() + 1e-2 for k, v in start.items()}
    trained = {k: v for k, v in master.items() if k != "embed.weight"}  # embed frozen: not streamed
    done = repo.commit("step", wvc.TensorStream(iter(trained.items())))
    got = repo.load_state_dict(done.commit)
    for k in start:
        want = start[k] if k == "embed.weight" else master[k].to(torch.bfloat16)
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k].view(torch.int16), want.view(torch.int16)), k


def test_a_sharded_checkpoint_stays_sharded(tmp_path):
    start = _weights(0)
    names = sorted(start)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    repo = wvc.Repo.init(tmp_path / "r")
    for file, members in shards.items():
        save_file({n: start[n] for n in members}, str(repo.root / file))
    index = {"metadata": {}, "weight_map": {n: f for f, ms in shards.items() for n in ms}}
    (repo.root / "model.safetensors.index.json").write_text(json.dumps(index))
    repo.commit("start")
    step = _nudged(start, 2)
    done = repo.commit("step", wvc.TensorStream(iter(step.items())))
    out = tmp_path / "out"
    repo.checkout(done.commit, output=out)
    assert sorted(p.name for p in out.iterdir()) == sorted([*shards, "model.safetensors.index.json"])
    for file, members in shards.items():
        want = tmp_path / file
        save_file({n: step[n] for n in members}, str(want))
        assert (out / file).read_bytes() == want.read_bytes()


def test_the_stream_is_let_go_a_tensor_at_a_time(tmp_path):
    start = _weights(0)
    repo = wvc.Repo.init(tmp_path / "r")
    save_file(start, str(repo.root / "model.safetensors"))
    repo.commit("start")
    alive = []

    def gathered():  # like FSDP's full_tensor(): a fresh tensor per parameter
        for k, v in start.items():
            gc.collect()
            held = [r for r in alive if r() is not None]
            assert len(held) <= 1, f"{len(held)} earlier tensors still held when {k} is gathered"
            t = v.float() + 1e-2
            alive.append(weakref.ref(t))
            yield k, t
            del t

    repo.commit("step", wvc.TensorStream(gathered()))
    assert len(alive) == len(start)


@pytest.mark.parametrize("bad", ["unknown", "shape"])
def test_a_stream_that_does_not_fit_the_parent_records_nothing(tmp_path, bad):
    start = _weights(0)
    repo = wvc.Repo.init(tmp_path / "r")
    save_file(start, str(repo.root / "model.safetensors"))
    head = repo.commit("start").commit
    pairs = list(_nudged(start, 3).items())
    pairs.insert(2, ("extra.weight", torch.zeros(3)) if bad == "unknown" else ("embed.weight", torch.zeros(3, 80)))
    with pytest.raises(InvalidArgument, match="extra.weight" if bad == "unknown" else "shape"):
        repo.commit("step", wvc.TensorStream(iter(pairs)))
    assert repo.head() == head
    assert [c.id for c in repo.log()] == [head]


def test_a_stream_needs_a_parent_version(tmp_path):
    repo = wvc.Repo.init(tmp_path / "r")
    with pytest.raises(InvalidArgument, match="parent"):
        repo.commit("first", wvc.TensorStream(iter(_weights(0).items())))
