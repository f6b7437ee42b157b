"""A public base model on the Hub (uploaded with plain huggingface_hub ``upload_folder``):
fine-tunes are pushed as deltas against it, never re-uploading it; clones rebuild them
byte-identically from the base's own Hub repo; the base is never copied into ``.wvc/``."""

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from safetensors.torch import load_file, save_file

import wvc
from wvc import Repo, clone
from wvc.errors import WvcError

from .conftest import TOKEN, sha256, tree_digests

pytestmark = pytest.mark.usefixtures("hub_env")
_names = itertools.count()
BASE_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def make_base(folder: Path, seed: int = 0) -> dict:
    """A bf16 model directory of about 8 MB, as a Hub repo holds one."""
    g = torch.Generator().manual_seed(seed)
    weights = {f"layers.{i}.weight": (torch.randn(512, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)}
    folder.mkdir(parents=True)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"hidden_size": 1024, "num_layers": 8}))
    (folder / "tokenizer.json").write_text(json.dumps({"vocab": {f"t{i}": i for i in range(2000)}}))
    return weights


def publish_base(hub, tmp_path, name: str | None = None, extra_files: dict | None = None) -> tuple[str, Path]:
    """Upload a base with the plain client, as any public model is published."""
    name = name or f"org/base-{next(_names)}"
    folder = tmp_path / name.replace("/", "-")
    make_base(folder)
    for rel, data in (extra_files or {}).items():
        (folder / rel).write_bytes(data)
    api = HfApi(endpoint=hub.base_url, token=TOKEN)
    api.create_repo(name, private=False)
    api.upload_folder(folder_path=str(folder), repo_id=name)
    return name, folder


def fine_tune(base_folder: Path, work: Path, scale: float = 1e-3, layers=None, seed: int = 1) -> None:
    """Write a fine-tune of the base into ``work``: every weight (or ``layers``) nudged, bf16."""
    g = torch.Generator().manual_seed(seed)
    weights = load_file(str(base_folder / "model.safetensors"))
    for i, (name, w) in enumerate(sorted(weights.items())):
        if layers is None or i in layers:
            w32 = w.float()
            weights[name] = (w32 + torch.randn(w32.shape, generator=g) * scale * w32.abs().mean()).to(torch.bfloat16)
    for rel in ("config.json", "tokenizer.json"):
        shutil.copyfile(base_folder / rel, work / rel)
    save_file(weights, str(work / "model.safetensors"), metadata={"format": "pt"})


def pushed_on_dir_base(tmp_path) -> tuple[Path, Repo, Path]:
    """(base directory, a repository on it with one fine-tune commit, the directory remote it was pushed to)."""
    base_folder = tmp_path / "base"
    make_base(base_folder)
    repo = Repo.init(tmp_path / "ft", base=str(base_folder))
    fine_tune(base_folder, repo.root)
    repo.commit("ft")
    repo.remote_add("origin", str(tmp_path / "remote"))
    repo.push()
    return base_folder, repo, tmp_path / "remote"


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_finetune_of_hub_base_pushes_only_the_delta_and_clones_byte_identically(tmp_path, hub, monkeypatch):
    name, base_folder = publish_base(hub, tmp_path, extra_files={"pytorch_model.bin": b"pickle, never read" * 100})
    base_size = sum((base_folder / f).stat().st_size for f in BASE_FILES)

    repo = Repo.init(tmp_path / "ft", base=f"hf://{name}")
    ref = repo.base()
    assert ref.url.startswith(f"hf://{name}@") and len(ref.url.rpartition("@")[2]) == 40  # pinned to the sha
    assert repo.head() == ref.commit
    cached = Path(repo.internals.db.get_config("base.dir"))
    assert cached.is_relative_to(tmp_path / "hf-cache")  # huggingface_hub's own cache
    assert sorted(p.name for p in cached.iterdir()) == sorted(BASE_FILES)  # the pickle duplicate is skipped
    assert dir_bytes(repo.internals.wvc_dir) < base_size / 10  # indexed, not copied

    fine_tune(base_folder, repo.root)
    result = repo.commit("fine-tune")
    digests = tree_digests(repo.root)
    repo.remote_add("origin", "hf://team/finetune")
    pushed = repo.push("origin", "main")
    print(f"\nbase {base_size} B, fine-tune delta stored {result.stored_bytes} B, "
          f"push uploaded {pushed.uploaded_bytes} B ({base_size / pushed.uploaded_bytes:.1f}x less than the base)")
    assert pushed.uploaded_bytes < base_size / 4
    assert pushed.uploaded_bytes < result.stored_bytes + 64 << 10  # the delta, commits and trees: none of the base
    remote_files = HfApi(endpoint=hub.base_url, token=TOKEN).list_repo_files("team/finetune")
    assert not any(f.endswith(".safetensors") for f in remote_files)
    assert dir_bytes(repo.internals.wvc_dir) < base_size / 4

    # elsewhere: a fresh huggingface_hub cache; the base comes from its own Hub repo
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "other-cache"))
    copy = clone("hf://team/finetune", tmp_path / "copy")
    assert tree_digests(copy.root) == digests
    assert copy.base() == ref
    assert dir_bytes(copy.internals.wvc_dir) < base_size / 4
    copy.checkout(ref.commit)  # the base itself, from the cache
    assert {f: sha256(copy.root / f) for f in BASE_FILES} == {f: sha256(base_folder / f) for f in BASE_FILES}
    assert copy.fsck().ok


def test_second_finetune_commit_and_branches_share_the_base(tmp_path, hub):
    name, base_folder = publish_base(hub, tmp_path)
    repo = Repo.init(tmp_path / "ft", base=f"hf://{name}@main")
    fine_tune(base_folder, repo.root, layers={0, 1})  # a partial fine-tune: 2 of 8 layers
    partial = repo.commit("partial")
    repo.create_branch("full", repo.base().commit)
    repo.checkout("full")
    fine_tune(base_folder, repo.root, seed=2)
    full = repo.commit("full")
    assert 0 < partial.stored_bytes < full.stored_bytes
    remote = tmp_path / "remote"
    repo.remote_add("origin", str(remote))
    for branch in ("main", "full"):
        repo.push("origin", branch)
    copy = clone(str(remote), tmp_path / "copy", branch="full", base_dir=base_folder)
    gc = repo.gc(grace_seconds=0)  # the base's chunks live in no pack: gc neither moves nor drops them
    assert repo.fsck().ok and gc.objects_removed == 0
    for commit in (partial.commit, full.commit):
        repo.checkout(commit)
        copy.checkout(commit)
        assert tree_digests(copy.root) == tree_digests(repo.root)


def test_directory_base_is_read_in_place_and_changes_are_caught(tmp_path, cli):
    base_folder = tmp_path / "base"
    make_base(base_folder)
    r = cli(tmp_path, "init", "ft", "--base", str(base_folder), "--json")
    assert r.exit_code == 0, r.output
    repo = Repo.open(tmp_path / "ft")
    fine_tune(base_folder, repo.root)
    repo.commit("ft")
    assert repo.fsck().ok
    with open(base_folder / "config.json", "a") as fh:  # grown: every chunk still checks out
        fh.write(" ")
    assert any("base file config.json changed" in e for e in repo.fsck().errors)
    # the base directory changes under the repository: never used silently
    data = bytearray((base_folder / "model.safetensors").read_bytes())
    data[-100] ^= 0xFF
    (base_folder / "model.safetensors").write_bytes(bytes(data))
    fsck = repo.fsck()
    assert not fsck.ok and any("base file model.safetensors changed" in e for e in fsck.errors)
    r = cli(repo.root, "checkout", "--force", "--output", str(tmp_path / "out"), repo.base().commit)
    assert r.exit_code == 1 and "base file model.safetensors changed" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_clone_refuses_a_base_whose_files_changed(tmp_path):
    base_folder, _, _ = pushed_on_dir_base(tmp_path)
    (base_folder / "config.json").write_text("{}")
    with pytest.raises(WvcError, match="does not match the one this history was made from"):
        clone(str(tmp_path / "remote"), tmp_path / "copy", base_dir=base_folder)
    assert not (tmp_path / "copy").exists()
    shutil.rmtree(base_folder)
    with pytest.raises(WvcError, match="does not exist"):
        clone(str(tmp_path / "remote"), tmp_path / "copy", base_dir=base_folder)


def test_offline_clone_uses_the_cache_or_says_what_is_missing(tmp_path, hub, monkeypatch):
    name, base_folder = publish_base(hub, tmp_path)
    repo = Repo.init(tmp_path / "ft", base=f"hf://{name}")
    fine_tune(base_folder, repo.root)
    repo.commit("ft")
    remote = tmp_path / "team-share"  # a directory remote: reachable while the Hub is not
    repo.remote_add("origin", str(remote))
    repo.push()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: offline
    offline = clone(str(remote), tmp_path / "offline-copy")  # the base is in this machine's cache
    assert tree_digests(offline.root) == tree_digests(repo.root)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    # declared offline (an unreachable endpoint ends the same way, after huggingface_hub's retries)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WvcError, match=r"HF_HUB_OFFLINE is set and the local huggingface_hub cache lacks "
                                       r"config.json, model.safetensors, tokenizer.json"):
        clone(str(remote), tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_base_errors_are_one_line_and_leave_nothing(tmp_path, hub, cli):
    name, _ = publish_base(hub, tmp_path)
    cases = {
        f"hf://{name}@no-such-branch": "revision not found",
        "hf://org/no-such-model": "repository not found",
        "hf://not a repo": "invalid base",
        str(tmp_path / "missing-dir"): "does not exist",
    }
    gated, _ = publish_base(hub, tmp_path)
    hub.storage.set_gated("models", gated, allowed_tokens=["someone-else"])
    cases[f"hf://{gated}"] = "gated repository"
    for spec, message in cases.items():
        target = tmp_path / f"t-{next(_names)}"
        r = cli(tmp_path, "init", str(target), "--base", spec)
        assert r.exit_code == 1 and message in r.output, (spec, r.output)
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
        assert not target.exists()


def test_push_refuses_mixing_bases(tmp_path):
    base_folder, _, _ = pushed_on_dir_base(tmp_path)
    plain = Repo.init(tmp_path / "b")
    fine_tune(base_folder, plain.root)
    plain.commit("no base")
    plain.remote_add("origin", str(tmp_path / "remote"))
    with pytest.raises(WvcError, match="is based on .* this repository has no base"):
        plain.push()
    with pytest.raises(WvcError, match="is based on"):
        plain.fetch()


def test_remote_view_of_a_finetune_reads_one_tensor(tmp_path, hub, monkeypatch):
    name, base_folder = publish_base(hub, tmp_path)
    repo = Repo.init(tmp_path / "ft", base=f"hf://{name}")
    fine_tune(base_folder, repo.root)
    repo.commit("ft")
    repo.remote_add("origin", "hf://team/view-ft")
    repo.push()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # no local base: range reads
    view = wvc.open("hf://team/view-ft", "main")
    before = hub.served_bytes
    w = view.tensor("layers.3.weight")
    served = hub.served_bytes - before
    expected = load_file(str(repo.root / "model.safetensors"))["layers.3.weight"]
    assert torch.equal(w.view(torch.int16), expected.view(torch.int16))
    model = (repo.root / "model.safetensors").stat().st_size
    assert served < model / 3  # that tensor's delta and its base chunk, not the model
    # exactly: the tensor's delta payloads from the fine-tune's packs, and the base chunks
    # they need, by range reads from the base's own repo
    chunks = view._get
    expected = 0
    for oid in view._entries["layers.3.weight"].chunks:
        entry = chunks.index[oid][1]
        expected += entry.length + chunks.base_chunks.locations[entry.base][2]
    assert served == expected


def test_lazy_clone_downloads_only_the_versions_it_uses(tmp_path, hub, cli):
    name, base_folder = publish_base(hub, tmp_path)
    # every version a delta against the base (max_chain 1): a version's own chunks are then
    # all that is fetched; with deeper chains a version needs the versions before it too
    repo = Repo.init(tmp_path / "ft", base=f"hf://{name}", max_chain=1)
    digests = {}
    for step in range(4):
        fine_tune(base_folder, repo.root, seed=10 + step, scale=1e-3 * (step + 1))
        digests[repo.commit(f"step {step}").commit] = tree_digests(repo.root)
    repo.remote_add("origin", "hf://team/lazy-ft")
    repo.push()

    full = clone("hf://team/lazy-ft", tmp_path / "full")
    r = cli(tmp_path, "clone", "--lazy", "--json", "hf://team/lazy-ft", str(tmp_path / "lazy"))
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    lazy = Repo.open(tmp_path / "lazy")
    head = repo.head()
    assert info["commit"] == head and tree_digests(lazy.root) == digests[head]
    full_bytes = full.stats()["stored_bytes"]
    lazy_bytes = lazy.stats()["stored_bytes"]
    assert lazy_bytes < full_bytes / 2  # one version's chunks of four
    assert info["downloaded_bytes"] < full_bytes / 2
    fsck = lazy.fsck()
    assert fsck.ok and fsck.not_fetched  # the other versions are promised, not damaged
    first = next(iter(digests))
    repo.checkout(first)
    cat = wvc.open(lazy.root, first).read_file("model.safetensors")  # single chunks fetched on first use
    assert cat == (repo.root / "model.safetensors").read_bytes()
    for commit, expected in digests.items():  # any version on first use, byte-identical
        lazy.checkout(commit)
        assert tree_digests(lazy.root) == expected
    assert not lazy.fsck().not_fetched
    w = lazy.load_state_dict(next(iter(digests)))["layers.0.weight"]
    assert w.dtype == torch.bfloat16

    # a commit on a branch whose version was never fetched still deltas against its parent
    again = clone("hf://team/lazy-ft", tmp_path / "lazy2", lazy=True)
    again.create_branch("old", first)
    out = tmp_path / "out"
    out.mkdir()
    fine_tune(base_folder, out, seed=99)
    result = again.commit("on old", source=out, branch="old")
    assert result.stored_bytes < (out / "model.safetensors").stat().st_size / 4


@pytest.mark.parametrize("record, message", [
    (b"not json", "not JSON"),
    (json.dumps({"url": "hf://org/name@main", "tree": "0" * 64, "commit": "0" * 64}).encode(), "does not pin a commit sha"),
    (json.dumps({"url": "relative/dir", "tree": "0" * 64, "commit": "0" * 64}).encode(), "neither a Hub repo"),
    (json.dumps({"url": "/", "tree": "zz", "commit": "0" * 64}).encode(), "malformed"),
    (json.dumps({"url": "/", "tree": "0" * 64, "commit": "0" * 64}).encode(), "not the root commit"),
])
def test_hostile_base_records_are_refused(tmp_path, cli, record, message):
    pushed_on_dir_base(tmp_path)
    (tmp_path / "remote" / "base.json").write_bytes(record)
    r = cli(tmp_path, "clone", str(tmp_path / "remote"), str(tmp_path / "copy"))
    assert r.exit_code == 1 and message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "copy").exists()


def test_a_remote_never_chooses_a_local_directory_to_read(tmp_path):
    """Issue 37, finding 19: a remote's base.json may name any absolute directory; reading it
    made a clone an oracle on the victim's files (and a FIFO there hung it). Only a directory
    the user names is read, checked against the recorded tree; the history stays the same."""
    import os
    import subprocess
    import sys

    import wvc
    from wvc.basemodel.base_ref import base_commit

    base_folder, repo, remote = pushed_on_dir_base(tmp_path)
    tip = repo.head()
    r = subprocess.run([sys.executable, "-m", "wvc", "clone", str(remote), "copy"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "--base-dir" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "copy").exists()
    with pytest.raises(WvcError, match="base-dir"):
        wvc.open(str(remote), "main")
    with pytest.raises(WvcError, match="base-dir"):
        clone(str(remote), tmp_path / "lazy", lazy=True)
    # a record an attacker made consistent for a directory holding a FIFO: refused at once, nothing opened there
    trap = tmp_path / "trap"
    trap.mkdir()
    os.mkfifo(trap / "model.safetensors")
    honest = (remote / "base.json").read_bytes()
    record = json.loads(honest)
    assert record["url"] == str(base_folder)
    record = {"url": str(trap), "tree": record["tree"], "commit": base_commit(str(trap), record["tree"]).id}
    (remote / "base.json").write_text(json.dumps(record))
    r = subprocess.run([sys.executable, "-m", "wvc", "clone", str(remote), "trapped"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--base-dir" in r.stderr, r.stderr
    (remote / "base.json").write_bytes(honest)
    # the user names where their copy is (elsewhere on this machine): the same history results
    moved = tmp_path / "my-copy-of-base"
    shutil.copytree(base_folder, moved)
    copy = clone(str(remote), tmp_path / "copy", base_dir=moved)
    assert copy.head() == tip and copy.base() == repo.base()
    assert copy.fsck().ok
    assert tree_digests(copy.root) == tree_digests(repo.root)
    assert wvc.open(str(remote), "main", base_dir=moved).read_file("model.safetensors") == \
        (repo.root / "model.safetensors").read_bytes()


def test_push_and_clone_say_what_became_of_the_base(tmp_path, hub, cli, monkeypatch):
    """Issue 66: "2.1 MB downloaded" said nothing of the base a clone also fetched (or found
    in the Hub cache), nor did a push say that the base was not uploaded."""
    name, base_folder = publish_base(hub, tmp_path)
    base_size = sum((base_folder / f).stat().st_size for f in BASE_FILES)
    repo = Repo.init(tmp_path / "ft", base=f"hf://{name}")
    fine_tune(base_folder, repo.root)
    repo.commit("ft")
    pinned = repo.base().url
    repo.remote_add("origin", "hf://team/says-base")
    pushed = cli(repo.root, "push", "--json")
    assert json.loads(pushed.output)["base"] == {"url": pinned, "logical_bytes": base_size, "downloaded_bytes": 0,
                                                 "source": "hub cache"}
    repo.remote_add("again", "hf://team/says-base-2")
    out = cli(repo.root, "push", "again").output
    assert f"base {pinned} (" in out and "not uploaded: a clone fetches it from the Hub" in out, out

    here = cli(tmp_path, "clone", "--json", "hf://team/says-base", str(tmp_path / "same-cache"))  # the cache has it all
    assert json.loads(here.output)["base"] == {"url": pinned, "logical_bytes": base_size, "downloaded_bytes": 0,
                                               "source": "hub cache"}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "fresh-cache"))
    out = cli(tmp_path, "clone", "hf://team/says-base", str(tmp_path / "fresh")).output
    assert f"base {pinned} (" in out and "downloaded from the Hub" in out, out
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "fresh-cache-2"))
    fresh = json.loads(cli(tmp_path, "clone", "--json", "hf://team/says-base", str(tmp_path / "fresh-2")).output)
    assert fresh["base"]["downloaded_bytes"] == base_size and fresh["base"]["source"] == "hub"
