"""snapshot_download follows huggingface_hub's conventions (issue 37, finding 9): a bare
`org/name` is a Hub repo, HF_HUB_OFFLINE answers from the cache, the cache honours HF_HOME,
and `wvc cache list|prune` show and free it."""

import json

import pytest

import wvc
from wvc import Repo
from wvc.errors import WvcError

from .test_everyday import run, two_tensors


@pytest.fixture
def hub_model(tmp_path, hub_env):
    url = f"hf://team/cached-{tmp_path.name}"
    repo = Repo.init(tmp_path / "src")
    two_tensors(repo.root / "model.safetensors")
    (repo.root / "config.json").write_text('{"v": 1}')
    first = repo.commit("one").commit
    (repo.root / "config.json").write_text('{"v": 2}')
    repo.commit("two")
    repo.remote_add("origin", url)
    repo.push()
    return repo, first, url


def test_a_bare_repo_id_is_a_hub_repo_and_the_cache_lives_under_hf_home(tmp_path, hub_model, monkeypatch):
    monkeypatch.delenv("WVC_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.chdir(tmp_path)
    url = hub_model[2]
    path = wvc.snapshot_download(url[len("hf://"):], "main")
    assert path.is_relative_to(tmp_path / "hf-home" / "wvc")
    assert (path / "config.json").read_bytes() == b'{"v": 2}'


def test_offline_answers_from_the_cache_or_says_what_is_missing(tmp_path, hub_model, monkeypatch):
    repo, first, url = hub_model
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    online = wvc.snapshot_download(url, "main")
    by_id = wvc.snapshot_download(url, first)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # any network use would fail
    assert wvc.snapshot_download(url, "main") == online
    assert wvc.snapshot_download(url, first) == by_id
    with pytest.raises(WvcError, match="HF_HUB_OFFLINE"):
        wvc.snapshot_download(url, "main~1")


def test_cache_list_and_prune(tmp_path, hub_model, monkeypatch):
    repo, first, url = hub_model
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "cache"))
    a = wvc.snapshot_download(url, "main")
    b = wvc.snapshot_download(url, first)
    listed = json.loads(run(tmp_path, "cache", "list", "--json").stdout)
    assert {v["tree"] for v in listed["versions"]} == {a.name, b.name}
    assert any(f"{url}@main" in v["names"] for v in listed["versions"])
    assert listed["bytes"] > 0
    import os

    os.utime(b, (1, 1))  # made decades ago
    out = json.loads(run(tmp_path, "cache", "prune", "--older-than", "30", "--json").stdout)
    assert out["removed"] == [b.name] and a.is_dir() and not b.exists()
    out = json.loads(run(tmp_path, "cache", "prune", "--all", "--json").stdout)
    assert out["removed"] == [a.name] and not a.exists()


def test_a_symlinked_entry_is_neither_counted_nor_reported_removed_and_nan_days_are_refused(tmp_path, monkeypatch):
    """Issue 49, item 11."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("WVC_CACHE", str(cache))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 100_000)
    real = cache / "trees" / ("a" * 64)
    real.mkdir(parents=True)
    (real / "model.safetensors").write_bytes(b"y" * 1000)
    (real / "link-to-big").symlink_to(outside / "big.bin")  # a file link inside a real entry: not counted
    (cache / "trees" / ("b" * 64)).symlink_to(outside, target_is_directory=True)
    listed = json.loads(run(tmp_path, "cache", "list", "--json").stdout)
    assert [v["tree"] for v in listed["versions"]] == ["a" * 64] and listed["bytes"] == 1000
    out = json.loads(run(tmp_path, "cache", "prune", "--all", "--json").stdout)
    assert out["removed"] == ["a" * 64] and out["freed_bytes"] == 1000
    assert (outside / "big.bin").stat().st_size == 100_000 and (cache / "trees" / ("b" * 64)).is_symlink()
    r = run(tmp_path, "cache", "prune", "--older-than", "nan", check=False)
    assert r.returncode == 2 and "not a number" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
