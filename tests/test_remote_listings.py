"""Each operation lists a remote once (issue 33): a listing is a directory walk, or on the
Hub ``repo_info`` + ``list_repo_files`` + a read per ref, so a clone that listed three times
and a lazy read that listed once per chunk paid for it on every call. Counted with a
counting directory backend and with the local Hub server's request log."""

import numpy as np
import pytest
import torch

import wvc
from wvc.remotes.path import PathBackend

CHUNK = 4096  # bytes: a 32 KiB float32 tensor is 8 chunks


def _model(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"big": torch.randn(8 * CHUNK // 4, generator=g), "small": torch.randn(16, generator=g)}


def _pushed(tmp_path, url: str):
    repo = wvc.Repo.init(tmp_path / "src", chunk_bytes=CHUNK)
    repo.commit("one", _model(0))
    repo.commit("two", _model(1))
    repo.remote_add("origin", url)
    repo.push("origin", "main")
    return repo


@pytest.fixture
def dir_listings(monkeypatch):
    """How many times a directory remote was listed (PathBackend.listing calls)."""
    calls = []
    original = PathBackend.listing

    def counted(self, *args, **kwargs):
        calls.append(self.url)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PathBackend, "listing", counted)
    return calls


def _hub_listings(hub) -> int:
    """Listings in the Hub server's request log: list_repo_files' tree requests."""
    return sum(1 for method, path in hub.requests if method == "GET" and "/tree/" in path)


def _chunks_of_big(repo) -> int:
    tree = repo.tree_of(repo.resolve("HEAD"))
    return len(next(t for f in tree.files for t in f.tensors if t.name == "big").chunks)


def test_directory_remote_clone_fetch_and_lazy_read_list_once_each(tmp_path, dir_listings):
    src = _pushed(tmp_path, str(tmp_path / "remote"))
    assert _chunks_of_big(src) == 8

    dir_listings.clear()
    clone = wvc.clone(str(tmp_path / "remote"), tmp_path / "full")
    assert len(dir_listings) == 1, f"clone listed the remote {len(dir_listings)} times"

    src.commit("three", _model(2))
    src.push("origin", "main")
    dir_listings.clear()
    clone.fetch("origin")
    assert len(dir_listings) == 1, f"fetch listed the remote {len(dir_listings)} times"

    wvc.clone(str(tmp_path / "remote"), tmp_path / "lazy", lazy=True)
    dir_listings.clear()
    _lazy_read_of_the_first_version(tmp_path / "lazy")
    assert len(dir_listings) == 1, f"a lazy read of 8 chunks listed the remote {len(dir_listings)} times"


def _lazy_read_of_the_first_version(path):
    """Read ``big`` of the first commit (its 8 chunks not local yet) in a newly opened lazy clone."""
    repo = wvc.Repo.open(path)
    old = repo.resolve("HEAD~2")
    chunks = next(t for f in repo.tree_of(old).files for t in f.tensors if t.name == "big").chunks
    assert len(chunks) == 8 and not any(repo.internals.store.has(c) for c in chunks)
    got = wvc.open(path, old).tensor("big")
    assert np.array_equal(got.numpy().view(np.uint32), _model(0)["big"].numpy().view(np.uint32))


def test_hub_remote_clone_fetch_and_lazy_read_list_once_each(tmp_path, hub, hub_env):
    url = "hf://team/listings"
    src = _pushed(tmp_path, url)

    hub.requests.clear()
    clone = wvc.clone(url, tmp_path / "full")
    assert _hub_listings(hub) == 1, hub.requests

    src.commit("three", _model(2))
    src.push("origin", "main")
    hub.requests.clear()
    clone.fetch("origin")
    assert _hub_listings(hub) == 1, hub.requests

    wvc.clone(url, tmp_path / "lazy", lazy=True)
    hub.requests.clear()
    _lazy_read_of_the_first_version(tmp_path / "lazy")
    assert _hub_listings(hub) == 1, hub.requests


def test_a_process_parses_each_remote_catalog_once(tmp_path):
    """A Publisher pushes every step and a follower opens the remote every step, from one
    process: each operation reading every catalog again made late pushes slow (issue 36's
    profile: 8.3 of 11.2 s parsing 143 catalogs). A catalog's name is its hash, so a parsed
    one is kept for the process."""
    from wvc.remotes.repository import PARSED_CATALOGS

    repo = wvc.Repo.init(tmp_path / "src", chunk_bytes=CHUNK)
    repo.remote_add("origin", str(tmp_path / "remote"))
    before = PARSED_CATALOGS.made
    for step in range(6):
        repo.commit(f"step {step}", _model(step))
        repo.push("origin", "main")
        wvc.open(str(tmp_path / "remote"), "main").tensor("small")
    catalogs = len(list((tmp_path / "remote" / "catalogs").iterdir()))
    made = 6 + 1  # one a push, and the compaction that merged four of them
    assert PARSED_CATALOGS.made - before <= made, (PARSED_CATALOGS.made - before, catalogs)


def test_a_listing_sorts_each_path_by_what_its_name_says_and_ignores_the_rest():
    """The layout map parses each listed path once (memoised across listings): what a path
    is must come from its whole name, the same on every listing."""
    from wvc.remotes.layout import sorted_listing

    h = "ab" * 32
    paths = [f"catalogs/{h}.cat", f"catalogs/{h}.cat.tmp", "catalogs/xyz.cat", f"packs/pack-{h}.pack",
             f"packs/pack-{'cd' * 32}.idx", f"packs/pack-{'cd' * 32}.pack", f"retired/0000000001-{'e' * 16}.json",
             "retired/1-2.json", f"pruned/0000000002-{'f' * 16}.json", f"steps/{h}.step", f"other/{h}.cat"]
    for _ in range(2):  # the second listing is served by the memo
        named = sorted_listing(paths)
        assert named["catalog"] == [h]
        assert named["idx"] == ["cd" * 32]  # a format-1 pack: its .idx is listed
        assert named["retired"] == [f"0000000001-{'e' * 16}"] and named["pruned"] == [f"0000000002-{'f' * 16}"]
