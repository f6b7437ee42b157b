"""User mistakes are WvcErrors: one line, exit 1 or 2, never "internal error", nothing
created or changed (architecture issue)."""

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo
from wvc.errors import DeviceUnavailable, InvalidArgument, UnsupportedTensor, WvcError

from .conftest import repo_state
from .test_cli import one_line_error


@pytest.mark.parametrize("args", [
    ("--chunk-size", "4"), ("--chunk-size", "0"), ("--chunk-size", "-5"), ("--chunk-size", str(2 ** 31)),
    ("--chunk-size", "1001"), ("--max-chain", "100000"), ("--max-chain", "-1"),
], ids=lambda a: " ".join(a))
def test_init_refuses_settings_out_of_range_and_creates_nothing(tmp_path, cli, args):
    r = cli(tmp_path, "init", "model", *args)
    line = one_line_error(r)
    assert r.exit_code == 2 and ("chunk size" in line or "max chain" in line), line
    assert not (tmp_path / "model").exists()


def test_init_settings_in_range_are_kept(tmp_path):
    with Repo.init(tmp_path / "m", chunk_bytes=64, max_chain=1000) as repo:
        assert (repo.chunk_bytes, repo.max_chain) == (64, 1000)


def test_init_in_an_existing_directory_refused_leaves_it_as_it_was(tmp_path, cli):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "keep.txt").write_text("mine")
    one_line_error(cli(tmp_path, "init", "model", "--chunk-size", "4"))
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["keep.txt"]


def _model(repo_root):
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(repo_root / "model.safetensors"))


def test_a_device_name_that_does_not_exist_is_a_usage_error(tmp_path, cli):
    repo = Repo.init(tmp_path / "m")
    _model(repo.root)
    before = repo_state(repo.root)
    r = cli(repo.root, "commit", "-m", "x", "--device", "gpu")
    assert r.exit_code == 2 and "device must be" in one_line_error(r)
    assert repo_state(repo.root) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path, cli):
    repo = Repo.init(tmp_path / "m")
    _model(repo.root)
    r = cli(repo.root, "commit", "-m", "x", "--device", "cuda")
    assert r.exit_code == 1 and "no usable CUDA GPU" in one_line_error(r)
    with pytest.raises(DeviceUnavailable):
        repo.load_state_dict(device="cuda")


def test_load_state_dict_on_auto_picks_a_device(tmp_path):
    repo = Repo.init(tmp_path / "m")
    _model(repo.root)
    repo.commit("v1")
    sd = repo.load_state_dict(device="auto")
    assert torch.equal(sd["w"].cpu(), torch.arange(64, dtype=torch.float32))
    with pytest.raises(InvalidArgument):
        repo.load_state_dict(device="gpu")


def test_a_tensor_wvc_cannot_store_is_named(tmp_path):
    repo = Repo.init(tmp_path / "m")
    before = repo_state(repo.root)
    with pytest.raises(UnsupportedTensor, match="complex64"):
        repo.commit("c", source={"z": torch.zeros(4, dtype=torch.complex64)})
    with pytest.raises(WvcError, match="not a tensor"):
        repo.commit("c", source={"z": [1, 2]})
    assert repo_state(repo.root) == before


def test_a_missing_tensor_name_is_a_wvc_error_and_a_key_error(tmp_path):
    import wvc

    repo = Repo.init(tmp_path / "m")
    _model(repo.root)
    repo.commit("v1")
    view = wvc.open(repo.root)
    with pytest.raises(KeyError):
        view.tensor("nope")
    with pytest.raises(WvcError, match="no tensor 'nope'"):
        view.tensor("nope")


def test_a_repository_an_older_wvc_made_with_deeper_chains_stays_readable(tmp_path):
    """Older wvc accepted any --max-chain: such a repository's own chains are still read
    (remotes are held to the fixed bound, store/chains.py)."""
    import struct

    from wvc.errors import CorruptObject
    from wvc.store.rows import ObjectRow
    from wvc.store.packs import PackWriter

    from .test_hostile_remotes import delta, keyframe

    tail = bytes(range(60))
    raws = [struct.pack("<I", i) + tail for i in range(1100)]
    objects = [keyframe(raws[0])] + [delta(raws[i], raws[i - 1]) for i in range(1, len(raws))]

    def store_chain(repo):
        writer = PackWriter(repo.internals.store.packs_dir)
        entries = [writer.add(oid, payload, raw_size, method, base) for oid, payload, raw_size, method, base in objects]
        name, size = writer.finish()
        with repo.internals.db.write():
            repo.internals.store.insert_rows((name, size), [ObjectRow(e.id, name, e.offset, e.length, e.raw_size, e.method,
                                                            e.base, depth) for depth, e in enumerate(entries)])

    deep = Repo.init(tmp_path / "deep")
    with deep.internals.db.write():
        deep.internals.db.set_config("max_chain", "5000")  # what `init --max-chain 5000` recorded before
    deep.close()
    deep = Repo.open(tmp_path / "deep")
    store_chain(deep)
    assert deep.internals.store.get(objects[-1][0]) == raws[-1]

    plain = Repo.init(tmp_path / "plain")  # the same chain in a repository of today's bound
    store_chain(plain)
    with pytest.raises(CorruptObject, match="deeper than"):
        plain.internals.store.get(objects[-1][0])
