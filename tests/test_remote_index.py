"""The remote's object index, commits and trees, brought up to date from the last listing's
(remotes/repository._MergedIndexes) instead of merged from every segment at every push,
hold what merging every segment gives, through compactions and a gc that drops objects."""

import torch

from wvc import Repo
from wvc.remotes import open_backend
from wvc.remotes.repository import MERGED_INDEXES, RemoteRepository


def check(url: str) -> None:
    remote = RemoteRepository.open(open_backend(url))
    contents = remote.contents
    index, commits, trees = MERGED_INDEXES._scratch(contents.segments)
    assert contents.index.keys() == index.keys()
    assert contents.commits == commits and contents.trees == trees
    packs = {seg.pack: {e.id for e in seg.entries} for seg in contents.segments}
    assert all(oid in packs[where[0]] for oid, where in contents.index.items())  # a segment listed holds it


def test_the_index_kept_up_to_date_is_the_index_built_from_scratch(tmp_path, monkeypatch):
    updated = []
    real = MERGED_INDEXES._update
    monkeypatch.setattr(MERGED_INDEXES, "_update", lambda *a: updated.append(real(*a)) or updated[-1])
    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a")
    repo.remote_add("origin", url)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1 << 14, generator=g).to(torch.bfloat16)
    for i in range(24):  # compactions replace segments along the way
        w[torch.randint(0, w.numel(), (400,), generator=g)] += 1
        repo.commit(f"step {i}", source={"w": w.clone()}, branch="main")
        repo.push()
        check(url)
    repo.create_branch("exp")
    repo.commit("exp", source={"w": w + 3}, branch="exp")
    repo.push(branch="exp")
    check(url)
    repo.delete_remote_branch("origin", "exp")
    repo.remote_gc("origin")  # a rewrite drops the branch's objects: built again
    check(url)
    assert sum(u is not None for u in updated) >= 20  # (brought up to date, not built again)
    held = MERGED_INDEXES.last[open_backend(url).url][1]
    assert len(held) == len(RemoteRepository.open(open_backend(url)).index)
