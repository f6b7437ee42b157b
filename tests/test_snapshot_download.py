"""wvc.snapshot_download: one version as a plain directory, cached by tree id."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import wvc  # noqa: E402
from wvc import Repo  # noqa: E402

from .conftest import tree_digests  # noqa: E402


def tiny_bert(path, seed=0):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 vocab_size=100, max_position_embeddings=32))
    model.save_pretrained(str(path))
    return model


def test_a_fine_tune_of_a_base_repository_downloads_loads_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    base = tmp_path / "base"
    model = tiny_bert(base)
    repo = Repo.init(tmp_path / "ft", base=str(base))
    repo.checkout("main", force=True)  # the base's files in the working tree
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.add_(0.01)  # a fine-tuning step
    model.save_pretrained(str(repo.root))
    repo.commit("fine-tune")
    out = tmp_path / "checkout"
    repo.checkout("main", output=out)
    repo.remote_add("origin", str(tmp_path / "remote"))
    repo.push()

    for source in (repo.root, "file://" + str(tmp_path / "remote")):
        path = wvc.snapshot_download(source, "main", base_dir=base)  # a directory base: named by the user
        assert path.parent == tmp_path / "cache" / "trees"
        assert tree_digests(path) == tree_digests(out)  # sha256 of every file
    loaded = transformers.AutoModel.from_pretrained(str(path))
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name

    import wvc.worktree.materialize as materialize

    writes = []
    real = materialize.write_file
    monkeypatch.setattr(materialize, "write_file", lambda *a, **k: writes.append(a) or real(*a, **k))
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*")}
    assert wvc.snapshot_download(repo.root, "main") == path
    assert writes == [] and {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*")} == before
    assert wvc.snapshot_download(repo.root, "main~1") != path  # the base: another version, another directory
