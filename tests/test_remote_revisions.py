"""Revisions on remotes use the local grammar (issue 37, findings 6 and 7): `HEAD~1` on a
remote is its main branch's parent, and `hf://org/name@rev` reads the Hub repository as of
that revision (and is never pushed to)."""

import pytest
from huggingface_hub import HfApi

import wvc
from wvc import Repo, clone
from wvc.errors import RemoteError

from .conftest import TOKEN
from .test_everyday import run, two_tensors


def _pushed(tmp_path, url, n=3):
    repo = Repo.init(tmp_path / "src")
    commits = []
    for i in range(n):
        two_tensors(repo.root / "model.safetensors", i, i + 10)
        (repo.root / "config.json").write_text(f'{{"v": {i}}}')
        commits.append(repo.commit(f"v{i}").commit)
    repo.remote_add("origin", url)
    repo.push()
    return repo, commits


@pytest.mark.parametrize("kind", ["path", "hub"])
def test_head_relative_revisions_on_a_remote(tmp_path, kind, request):
    url = str(tmp_path / "remote") if kind == "path" else f"hf://team/revs-{tmp_path.name}"
    if kind == "hub":
        request.getfixturevalue("hub_env")
    repo, commits = _pushed(tmp_path, url)
    assert wvc.open(url, "HEAD").commit == commits[-1]
    assert wvc.open(url, "HEAD~1").commit == commits[-2]
    assert wvc.open(url, "HEAD~2").read_file("config.json") == b'{"v": 0}'
    path = wvc.snapshot_download(url, "HEAD~1", cache_dir=tmp_path / "cache")
    assert (path / "config.json").read_bytes() == b'{"v": 1}'


def test_hub_urls_with_a_revision_clone_and_fetch_as_of_it(tmp_path, hub_env):
    url = "hf://team/pinned"
    repo, commits = _pushed(tmp_path, url, n=1)
    sha_then = HfApi(endpoint=hub_env.base_url, token=TOKEN).repo_info("team/pinned").sha
    two_tensors(repo.root / "model.safetensors", 7, 8)
    later = repo.commit("later").commit
    repo.push()
    copy = clone(f"{url}@{sha_then}", tmp_path / "then")
    assert copy.head() == commits[0]
    now = clone(f"{url}@main", tmp_path / "now")
    assert now.head() == later
    r = run(tmp_path / "then", "remote", "add", "pinned", f"{url}@{sha_then}")
    r = run(tmp_path / "then", "fetch", "pinned")
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    r = run(tmp_path / "then", "push", "pinned", check=False)
    assert r.returncode == 1 and "pinned to a revision" in r.stderr
    for bad in ("hf://team/pinned@", "hf://team/pi nned", "hf://team/x@a..b"):
        r = run(tmp_path, "clone", bad, "bad", check=False)
        assert r.returncode != 0 and "invalid Hub URL" in r.stderr and "internal error" not in r.stderr, r.stderr
    with pytest.raises(RemoteError, match="revision not found"):
        clone(f"{url}@no-such-branch", tmp_path / "nope")
