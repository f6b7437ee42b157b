"""A remote URL that names someone else's content (a plain Hub model repository) is never
written into or read as wvc history, and a README.md wvc did not write is never replaced
(issue 37, findings 3, 10 and 11)."""

import json

import pytest
from huggingface_hub import HfApi

from wvc import Repo, clone
from wvc.errors import BaseModelError, NotAWvcRemote, RemoteError, RemoteNotFound
from wvc.remotes.interface import Backend, Listing
from wvc.remotes.layout import LAYOUT

from .conftest import TOKEN, RemoteFiles, repo_state
from .test_everyday import run, two_tensors

CARD = "---\nlibrary_name: sentence-transformers\n---\n# plain\n\nA model card its authors wrote.\n"


def plain_hub_model(hub, tmp_path, name: str) -> str:
    """An ordinary model repository, made the way its owners make one (upload_folder)."""
    src = tmp_path / f"src-{name}"
    src.mkdir()
    two_tensors(src / "model.safetensors")
    (src / "config.json").write_text('{"hidden_size": 256}')
    (src / "README.md").write_text(CARD)
    api = HfApi(endpoint=hub.base_url, token=TOKEN)
    api.create_repo(f"org/{name}")
    api.upload_folder(repo_id=f"org/{name}", folder_path=str(src))
    return f"hf://org/{name}"


def test_push_into_a_plain_model_repo_is_refused_and_changes_nothing(tmp_path, hub_env):
    url = plain_hub_model(hub_env, tmp_path, "plain")
    files = RemoteFiles(url, hub_env)
    before = {p: files.read(p) for p in files.paths()}
    root = tmp_path / "mine"
    root.mkdir()
    two_tensors(root / "model.safetensors", 3, 4)
    run(root, "init")
    run(root, "commit", "-m", "one")
    run(root, "remote", "add", "origin", url)
    local = repo_state(root)
    r = run(root, "push", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "is not a wvc remote" in r.stderr and "model.safetensors" in r.stderr and "init --base" in r.stderr
    assert {p: files.read(p) for p in files.paths()} == before  # no packs, no refs, the card as it was
    assert repo_state(root) == local


def test_a_readme_wvc_did_not_write_is_kept_and_ours_is_updated(tmp_path, hub_env):
    api = HfApi(endpoint=hub_env.base_url, token=TOKEN)
    api.create_repo("org/with-card")
    api.upload_file(path_or_fileobj=CARD.encode(), path_in_repo="README.md", repo_id="org/with-card")
    repo = Repo.init(tmp_path / "a")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    repo.remote_add("origin", "hf://org/with-card")
    repo.push()
    assert RemoteFiles("hf://org/with-card", hub_env).read("README.md").decode() == CARD
    # a remote whose card wvc wrote gets it refreshed with a new branch
    repo.remote_add("own", "hf://org/own-card")
    repo.push("own")
    repo.create_branch("experiment")
    repo.push("own", "experiment")
    card = RemoteFiles("hf://org/own-card", hub_env).read("README.md").decode()
    assert "`main`" in card and "`experiment`" in card


def test_a_push_that_adds_no_branch_leaves_the_card_alone(tmp_path, hub_env):
    """The card names branches, not commits: a training run's pushes neither read it nor send
    it again (each rewrite was a read of it, its upload inside the commit and the Hub's check
    of its YAML: three requests a push, counted against the Hub's rate limits)."""
    repo = Repo.init(tmp_path / "a")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    repo.remote_add("origin", "hf://org/steady")
    repo.push()
    files = RemoteFiles("hf://org/steady", hub_env)
    card = files.read("README.md")
    for step in range(2):
        two_tensors(repo.root / "model.safetensors", 5 + step, 6)
        repo.commit(f"step {step}")
        before = len(hub_env.requests)
        repo.push()
        during = hub_env.requests[before:]
        assert not [r for r in during if "README.md" in r[1] or "validate-yaml" in r[1]], during
    assert files.read("README.md") == card
    assert Repo.open(repo.root).head()[:12] not in card.decode()


def test_the_model_card_describes_the_layout_as_written(tmp_path, hub_env):
    repo = Repo.init(tmp_path / "a")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    repo.remote_add("origin", "hf://org/layout")
    repo.push()
    files = RemoteFiles("hf://org/layout", hub_env)
    card = files.read("README.md").decode()
    assert "pypi.org" not in card and "pip install wvc" not in card  # not what installs this project
    tops = {p.split("/")[0] + "/" for p in files.paths() if "/" in p}
    for top in tops:
        assert f"`{top}`" in card, (top, card)
    assert "objects/" not in tops and "`objects/`" not in card


def test_clone_of_a_plain_model_repo_says_it_is_not_a_wvc_remote(tmp_path, hub_env):
    url = plain_hub_model(hub_env, tmp_path, "plain-clone")
    with pytest.raises(NotAWvcRemote, match="init --base"):
        clone(url, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    r = run(tmp_path, "clone", url, "out2", check=False)
    assert r.returncode == 1 and "not a wvc remote" in r.stderr and "no branches" not in r.stderr


def test_init_base_refuses_a_wvc_remote(tmp_path, hub_env):
    repo = Repo.init(tmp_path / "a")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    repo.remote_add("origin", "hf://org/is-wvc")
    repo.remote_add("dir", str(tmp_path / "dir-remote"))
    repo.push()
    repo.push("dir")
    for base in ("hf://org/is-wvc", str(tmp_path / "dir-remote")):
        with pytest.raises(BaseModelError, match="is a wvc remote"):
            Repo.init(tmp_path / "b", base=base)
        assert not (tmp_path / "b").exists()


class _Files(Backend):
    """A backend of plain files in memory: the file interface only, no judgement of its own."""

    def __init__(self, files: dict[str, bytes], *, keeps_marker: bool, exists: bool = True):
        self.url, self.files, self.keeps_marker, self.exists, self.made = "mem://x", dict(files), keeps_marker, exists, 0
        self.layout = LAYOUT

    def listing(self) -> Listing:
        if not self.exists:
            raise RemoteNotFound(f"{self.url}: not found")
        return Listing({}, "v", frozenset(self.files))

    def make(self) -> None:
        self.exists, self.made = True, self.made + 1

    def write_new(self, handle, data: bytes) -> None:
        self.files.setdefault(self.layout.path(handle), data)

    def read(self, handle, limit: int):
        return self.files.get(self.layout.path(handle))


def test_the_remote_repository_alone_judges_what_a_backend_holds():
    """Issue 52: a backend lists files; whether they are a wvc remote, and making an empty one
    one, is the remote repository's (the same rules the four backends applied on their own)."""
    from wvc.remotes.repository import read_state

    marked = _Files({}, keeps_marker=True)  # a directory or S3 prefix: the marker says
    with pytest.raises(RemoteError, match="not a wvc remote"):
        read_state(marked)  # a read of an empty place
    assert read_state(marked, create=True).files == {"wvc.json"}  # a push's makes it one
    assert marked.files == {"wvc.json": b'{"format": 1}'}  # the bytes wvc always wrote
    assert read_state(marked).refs == {}
    other = _Files({"notes.txt": b"mine"}, keeps_marker=True)
    with pytest.raises(RemoteError, match="exists and is not a wvc remote"):
        read_state(other, create=True)
    assert other.files == {"notes.txt": b"mine"}  # left as it was

    model = _Files({"README.md": b"", "model.safetensors": b"x"}, keeps_marker=False)  # a Hub repo: its files say
    for create in (False, True):
        with pytest.raises(NotAWvcRemote, match="model.safetensors"):
            read_state(model, create=create)
    assert read_state(_Files({"README.md": b"", ".gitattributes": b""}, keeps_marker=False)).refs == {}
    missing = _Files({}, keeps_marker=False, exists=False)
    with pytest.raises(RemoteNotFound):
        read_state(missing)
    assert missing.made == 0
    read_state(missing, create=True)
    assert missing.made == 1 and "wvc.json" not in missing.files  # no marker where none is kept
    pinned = _Files({}, keeps_marker=False)
    pinned.read_only = "pinned to a revision"
    with pytest.raises(RemoteError, match="pinned"):
        read_state(pinned, create=True)
