"""commit -> change -> commit -> checkout the old commit gives byte-identical files."""

import json

import torch
from safetensors.torch import save_file

from wvc import Repo

from .conftest import ALL_DTYPES, random_tensor, tree_digests


def write_model(root, seed):
    """A sharded model with every dtype, 0-d and empty tensors, metadata and side files."""
    shard1 = {f"layer.{name}": random_tensor(dt, (7, 9), seed + i) for i, (name, dt) in enumerate(ALL_DTYPES.items())}
    shard1["scalar"] = random_tensor(torch.float32, (), seed)
    shard1["empty"] = torch.empty(0, 3, dtype=torch.bfloat16)
    shard2 = {"big.weight": random_tensor(torch.bfloat16, (300, 200), seed + 99)}
    save_file(shard1, str(root / "model-00001-of-00002.safetensors"), metadata={"format": "pt", "seed": str(seed)})
    save_file(shard2, str(root / "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 0}, "weight_map": {**{k: "model-00001-of-00002.safetensors" for k in shard1},
                                                          **{k: "model-00002-of-00002.safetensors" for k in shard2}}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps({"seed": seed}))
    (root / "tokenizer").mkdir(exist_ok=True)
    (root / "tokenizer" / "vocab.txt").write_bytes(bytes(range(256)) * (seed + 1))
    (root / "empty.bin").write_bytes(b"")


def test_every_version_checks_out_byte_identical(tmp_path):
    root = tmp_path / "m"
    root.mkdir()
    repo = Repo.init(root, chunk_bytes=1024)  # small chunks: many chunks per tensor
    versions = {}
    for seed in (1, 2, 3):
        write_model(root, seed)
        if seed == 3:
            (root / "empty.bin").unlink()
            (root / "extra.json").write_text("{}")
        versions[repo.commit(f"v{seed}").commit] = tree_digests(root)
    for commit_id, digests in versions.items():
        repo.checkout(commit_id)
        assert tree_digests(root) == digests
        out = tmp_path / ("out-" + commit_id[:8])
        repo.checkout(commit_id, output=out)
        assert tree_digests(out) == digests
    assert repo.fsck().ok


def test_reshaped_and_appended_tensors_round_trip(repo):
    root = repo.root
    w = random_tensor(torch.bfloat16, (100, 64), 5)
    save_file({"embed": w}, str(root / "model.safetensors"))
    a = repo.commit("a").commit
    digest_a = tree_digests(root)
    save_file({"embed": torch.cat([w, random_tensor(torch.bfloat16, (7, 64), 6)])}, str(root / "model.safetensors"))
    b = repo.commit("new rows").commit
    digest_b = tree_digests(root)
    save_file({"embed": w.float()}, str(root / "model.safetensors"))
    repo.commit("dtype change")
    repo.checkout(a)
    assert tree_digests(root) == digest_a
    repo.checkout(b)
    assert tree_digests(root) == digest_b


def test_delta_chains_are_bounded_and_still_exact(tmp_path):
    repo = Repo.init(tmp_path / "m", max_chain=3)
    w = torch.randn(4096) * 0.02
    digests = {}
    for step in range(9):
        w += torch.randn(4096) * 1e-4
        save_file({"w": w.to(torch.bfloat16)}, str(repo.root / "model.safetensors"))
        digests[repo.commit(f"step {step}").commit] = tree_digests(repo.root)
    depths = [d for (d,) in repo.internals.db.query("SELECT depth FROM objects")]
    assert max(depths) <= 3
    assert 0 < depths.count(0) < len(depths)  # keyframes exist, but most chunks are deltas
    for commit_id, d in digests.items():
        repo.checkout(commit_id)
        assert tree_digests(repo.root) == d


def test_state_dict_commit_matches_file_commit_and_loads_back(tmp_path):
    sd = {f"t.{name}": random_tensor(dt, (4, 6), i) for i, (name, dt) in enumerate(ALL_DTYPES.items())}
    sd["zero_d"] = torch.tensor(3.0, dtype=torch.bfloat16)
    from_file = Repo.init(tmp_path / "a")
    save_file(sd, str(from_file.root / "model.safetensors"))
    tree_file = from_file.commit("from file").tree
    from_memory = Repo.init(tmp_path / "b")
    tree_mem = from_memory.commit("from memory", source=sd).tree
    assert tree_mem == tree_file
    loaded = from_memory.load_state_dict("HEAD")
    lazy = from_memory.load_state_dict("HEAD", lazy=True)
    assert set(loaded) == set(sd) == set(lazy)
    for name, t in sd.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape
        assert as_bytes(loaded[name]) == as_bytes(t)
        assert as_bytes(lazy[name]) == as_bytes(t)
    from_memory.checkout("HEAD", output=tmp_path / "c")
    assert tree_digests(tmp_path / "c") == tree_digests(from_file.root)


def as_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_identical_content_is_stored_once(repo):
    t = random_tensor(torch.float32, (1000,), 1)
    save_file({"a": t, "b": t.clone()}, str(repo.root / "model.safetensors"))
    res = repo.commit("dup")
    assert res.new_objects == 2  # header + one chunk shared by both tensors
