"""Long histories (remote format 2): segments with catalogs, compaction that keeps the file
count bounded, clones and fetches in a bounded number of requests, format-1 remotes still
read, compaction racing pushers and failing at any step, and ``gc --remote``.
``python -m benchmarks.long_history`` measures 1,000 pushes."""

import threading

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo, clone
from wvc.errors import WvcError
from wvc.remotes import compaction, open_backend
from wvc.remotes.layout import handle_of, handles

from .conftest import RemoteFiles, push_until_landed, tree_digests, url_of

pytestmark = pytest.mark.usefixtures("hub_env")


class TinyTrainer:
    """A 16 KB bf16 model that moves a little each step: one small commit a push."""

    def __init__(self, repo: Repo, seed: int = 0, path: str = "model.safetensors"):
        self.repo = repo
        self.path = path
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(64, 64, generator=g) * 0.02
        self.g = g

    def push_steps(self, names) -> None:
        """Commit and push once a name."""
        for name in names:
            self.commit(name)
            self.repo.push()

    def commit(self, msg: str = "step") -> str:
        self.w += torch.randn(self.w.shape, generator=self.g) * 1e-3
        save_file({"w": self.w.to(torch.bfloat16), "b": torch.zeros(64, dtype=torch.bfloat16)},
                  str(self.repo.root / self.path))
        return self.repo.commit(msg).commit


def remote_file_count(url: str, hub) -> int:
    return len(RemoteFiles(url, hub).paths())


def test_a_hundred_pushes_leave_few_files_and_clone_in_few_requests(tmp_path, hub):
    url = "hf://team/long-history"
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    repo.remote_add("origin", url)
    trainer.push_steps(f"step {i}" for i in range(100))
    files = remote_file_count(url, hub)
    assert files <= 40, files  # format 1: 405 files for the same history
    before = len(hub.requests)
    copy = clone(url, tmp_path / "copy")
    clone_requests = len(hub.requests) - before
    assert clone_requests <= 50, clone_requests
    assert len(copy.log()) == 100 and tree_digests(copy.root) == tree_digests(repo.root)
    trainer.commit("one more")
    repo.push()
    before = len(hub.requests)
    fetched = copy.fetch()
    assert fetched.commits == 1 and len(hub.requests) - before <= 10, hub.requests[before:]


@pytest.mark.parametrize("kind", ["path", "s3"])
def test_retired_files_are_deleted_after_the_grace_period(tmp_path, monkeypatch, kind, request):
    """Directory and S3 remotes cannot delete in the push's own step: compaction retires
    what it replaced, and a later push deletes it once the grace period has passed."""
    url = url_of(kind, tmp_path, request, "long")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    repo.remote_add("origin", url)
    trainer.push_steps(f"step {i}" for i in range(12))
    kept = remote_file_count(url, None)
    records = [p for p in RemoteFiles(url, None).paths() if p.startswith("attic/retired/")]
    assert records  # compaction happened, its replaced files wait out the grace period
    monkeypatch.setenv("WVC_REMOTE_GRACE_SECONDS", "0")
    trainer.push_steps(f"step {i}" for i in range(12, 40))
    paths = RemoteFiles(url, None).paths()
    assert len(paths) <= kept and len([p for p in paths if p.startswith(("retired/", "attic/retired/"))]) <= 1
    copy = clone(url, tmp_path / "copy")
    assert len(copy.log()) == 40 and tree_digests(copy.root) == tree_digests(repo.root)


@pytest.mark.parametrize("kind", ["path", "s3"])
def test_retired_files_leave_the_listing_and_a_reader_listed_before_still_reads_them(tmp_path, kind, request):
    """What compaction replaced waits out the grace period in the attic, not in the folders
    every push lists (a push late in a long run listed every segment of the last hour), and
    a reader that listed the remote before the move reads every file it listed."""
    import wvc
    from wvc.remotes.repository import RemoteRepository

    url = url_of(kind, tmp_path, request, "attic")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    repo.remote_add("origin", url)
    trainer.push_steps(["step 0"])
    early = wvc.open(url)  # a reader that listed one segment, and reads its pack lazily
    first = repo.head()
    backend = open_backend(url)
    listed_then = backend.listing()
    trainer.push_steps(f"step {i}" for i in range(1, 40))

    remote = RemoteRepository.open(open_backend(url))
    listed = [p for p in remote.state.files if p.startswith(("packs/", "catalogs/"))]
    assert [g.catalog for g in remote.contents.segments] == [g.catalog for g in remote.contents.live_segments]  # none retired
    assert len(listed) == 2 * len(remote.contents.segments) < 16, listed
    stored = RemoteFiles(url, None).paths()
    assert not remote.state.retired  # each record moved too, once its files had
    records = remote.attic_records()
    retired = {p for paths in records.values() for p in paths}
    assert retired and all(f"attic/{p}" in stored and p not in stored for p in retired)
    assert all(f"attic/retired/{r}.json" in stored for r in records)

    old = [p for p in listed_then.files if p.startswith(("packs/", "catalogs/"))]
    assert old and all(p in retired for p in old)
    for path in old:  # the backend, as a pinned reader asks it
        assert backend.read(handle_of(path), 1 << 20) == RemoteFiles(url, None).read(f"attic/{path}")
        assert backend.read_range(handle_of(path), 0, 4) == RemoteFiles(url, None).read(f"attic/{path}")[:4]
    assert early.commit == first
    assert {k: v.view(torch.uint8).flatten().tolist() for k, v in early.state_dict().items()} == \
        {k: v.view(torch.uint8).flatten().tolist() for k, v in wvc.open(repo.root, first).state_dict().items()}
    copy = clone(url, tmp_path / "copy")
    assert len(copy.log()) == 40 and tree_digests(copy.root) == tree_digests(repo.root)


@pytest.mark.parametrize("failure", ["remote", "os"])
def test_retired_files_a_push_left_listed_are_moved_by_the_next(tmp_path, monkeypatch, failure):
    """The record retires a file, the move only hides it: a push that stopped after
    publishing (here: whose move failed, as the remote said or as the file system did) has
    landed, leaves retired files listed, still retired, and the next push moves them."""
    from wvc.errors import RemoteError
    from wvc.remotes.path import PathBackend
    from wvc.remotes.repository import RemoteRepository

    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    repo.remote_add("origin", url)
    trainer.push_steps(f"step {i}" for i in range(3))

    def fail(self, paths):
        if failure == "os":
            raise PermissionError(13, "simulated: the attic cannot be written")
        raise RemoteError("simulated: the move did not happen")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PathBackend, "move_to_attic", fail)
        trainer.push_steps(["step 3"])  # compacts, and lands
        assert open_backend(url).listing().refs["refs/heads/main"] == repo.head()
    remote = RemoteRepository.open(open_backend(url))
    left = remote.contents.retired & remote.state.files
    assert left and all(p.startswith(("packs/", "catalogs/")) for p in left)
    assert len(remote.contents.live_segments) < len(remote.contents.segments)  # listed, and retired
    trainer.push_steps(["step 4"])
    stored = RemoteFiles(url, None).paths()
    assert all(p not in stored and f"attic/{p}" in stored for p in left)
    copy = clone(url, tmp_path / "copy")
    assert len(copy.log()) == 5 and tree_digests(copy.root) == tree_digests(repo.root)


def test_a_push_lists_the_attic_only_when_a_retirement_may_be_due(tmp_path, monkeypatch):
    """The attic's records are listed when the oldest retirement this process knows of has
    passed its grace period, or a grace period after the last listing (another process's
    retirements are younger than that), not at every push."""
    from wvc.remotes import compaction
    from wvc.remotes.path import PathBackend

    url = str(tmp_path / "remote")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    repo.remote_add("origin", url)
    listings = []
    real = PathBackend.attic_names
    monkeypatch.setattr(PathBackend, "attic_names", lambda self, folder: listings.append(folder) or real(self, folder))
    monkeypatch.setitem(compaction._RETIRED_SINCE, str(tmp_path / "remote"), (None, 0.0))  # never listed here
    trainer.push_steps(f"step {i}" for i in range(20))  # compacts several times
    assert len(listings) == 1  # the first push's, and no retirement has come of age since
    monkeypatch.setenv("WVC_REMOTE_GRACE_SECONDS", "0")
    trainer.push_steps(["step 20"])
    assert len(listings) == 2
    assert not [p for p in RemoteFiles(url, None).paths() if p.startswith("attic/retired/")][1:]  # purged but the newest
    other = str(tmp_path / "remote")  # another process's retirements, a grace period after this one listed
    monkeypatch.setenv("WVC_REMOTE_GRACE_SECONDS", "3600")
    compaction._RETIRED_SINCE[other] = (None, 0.0)
    assert compaction.purge_due(other)


def test_an_s3_listing_steps_over_the_attic_however_many_files_it_holds(tmp_path, request):
    """S3 lists keys in order, a thousand a request: the listing skips the attic's keys with
    one more request, whatever their number, and lists every other key."""
    import boto3

    url = url_of("s3", tmp_path, request, "many")
    repo = Repo.init(tmp_path / "a")
    repo.remote_add("origin", url)
    TinyTrainer(repo).push_steps(["step 0"])
    bucket, prefix = url[len("s3://"):].split("/", 1)
    client = boto3.client("s3")
    for i in range(1100):  # more than a page of retired files
        client.put_object(Bucket=bucket, Key=f"{prefix}/attic/packs/pack-{i:064x}.pack", Body=b"x")
    client.put_object(Bucket=bucket, Key=f"{prefix}/README.md", Body=b"before the attic in key order")
    backend = open_backend(url)
    returned = []  # the keys each list request brought back
    backend.client.meta.events.register("after-call.s3.ListObjectsV2",
                                        lambda parsed, **_: returned.append(len(parsed.get("Contents", ()))))
    listed = backend.listing().files
    everything = set(RemoteFiles(url, None).paths())
    live = {p for p in everything if not p.startswith("attic/")}
    assert set(listed) == live and "README.md" in listed
    # the attic's keys are not downloaded (a first page of 1,000 held 1,000 of them, ~300 KB):
    # two requests a pass, and a listing passes twice (before and after it reads the refs)
    assert len(returned) <= 4 and sum(returned) <= 2 * (len(live) + 16), returned


def _push_format_1(repo: Repo, url: str) -> None:
    """What wvc wrote before format 2: a pack with its .idx, one file a commit and a tree."""
    from wvc.remotes.repository import read_state
    from wvc.model.versions import canonical_json
    from wvc.remotes.layout import commit_path, pack_path, tree_path
    from wvc.store.packs import PackWriter, pack_filename

    remote = open_backend(url)
    state = read_state(remote, create=True)
    head = repo.head()
    commits = repo.internals.graph.ancestors(head)
    chunks = {c for cid in commits for c in repo.internals.read_tree(repo.read_commit(cid).tree).chunk_ids()}
    writer = PackWriter(tmp := repo.internals.wvc_dir)
    for oid in sorted(chunks):
        for row in repo.internals.store.chain(oid):
            if row.id not in {e.id for e in writer.entries}:
                writer.add(row.id, repo.internals.store.reader.read(row.pack, row.offset, row.length), row.raw_size,
                           row.method, row.base)
    entries = list(writer.entries)
    name, _ = writer.finish()
    files = {pack_path(name): tmp / pack_filename(name), pack_path(name, "idx"): canonical_json([e.to_json()
                                                                                                  for e in entries])}
    for cid in commits:
        commit = repo.read_commit(cid)
        files[commit_path(cid)] = commit.to_bytes()
        files[tree_path(commit.tree)] = repo.internals.read_tree(commit.tree).to_bytes()
    remote.publish(dict(zip(handles(files), files.values())), {"refs/heads/main": head}, state, "format 1")


@pytest.mark.parametrize("kind", ["path", "hub"])
def test_a_format_1_remote_is_read_and_pushed_onto(tmp_path, kind, hub, request):
    url = url_of(kind, tmp_path, request, "format-1")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    for i in range(3):
        trainer.commit(f"old {i}")
    _push_format_1(repo, url)
    old = clone(url, tmp_path / "old")
    assert len(old.log()) == 3 and tree_digests(old.root) == tree_digests(repo.root)
    repo.remote_add("origin", url)
    repo.fetch()
    trainer.push_steps(f"new {i}" for i in range(6))  # enough to compact the format-1 pack too
    copy = clone(url, tmp_path / "copy")
    assert len(copy.log()) == 9 and tree_digests(copy.root) == tree_digests(repo.root)
    lazy = clone(url, tmp_path / "lazy", lazy=True)
    lazy.checkout("main~7", output=tmp_path / "lazy-old")
    assert (tmp_path / "lazy-old" / "model.safetensors").stat().st_size > 0


@pytest.mark.parametrize("kind", ["path", "hub"])
def test_compaction_racing_another_pusher_loses_nothing(tmp_path, kind, hub, request):
    url = url_of(kind, tmp_path, request, "race")
    seed = Repo.init(tmp_path / "seed")
    TinyTrainer(seed).commit("base")
    seed.remote_add("origin", url)
    seed.push()
    clients = [clone(url, tmp_path / f"c{i}") for i in range(2)]
    errors = []

    def work(i):
        repo = Repo.open(clients[i].root)
        trainer = TinyTrainer(repo, seed=10 + i, path=f"client{i}.safetensors")  # rebases apply cleanly
        try:
            for k in range(8):
                trainer.commit(f"c{i}-{k}")
                if not push_until_landed(repo):
                    errors.append(f"client {i}: c{i}-{k} never got pushed")
        except Exception as exc:  # noqa: BLE001
            errors.append(f"client {i}: {exc!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == []
    final = clone(url, tmp_path / "final")
    assert sorted(e.message for e in final.log()[:-1]) == sorted(f"c{i}-{k}" for i in range(2) for k in range(8))
    assert final.fsck().ok


@pytest.mark.parametrize("kind, where", [("path", "after merging"), ("path", "while publishing"),
                                         ("path", "while purging"), ("hub", "after merging"),
                                         ("hub", "while publishing")])
def test_compaction_failing_at_any_step_leaves_the_remote_valid(tmp_path, monkeypatch, hub, kind, where, request):
    url = url_of(kind, tmp_path, request, "crash")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    repo.remote_add("origin", url)
    trainer.push_steps(f"step {i}" for i in range(3))
    last_good = repo.head()
    trainer.commit("step 3")  # this push compacts

    def crash(*args, **kwargs):
        raise WvcError(f"simulated crash {where}")

    if where == "while purging":
        repo.push()  # compacted; the next push purges what it retired
        last_good = repo.head()
        trainer.commit("step 4")
    with pytest.MonkeyPatch.context() as mp:  # the crash, and nothing else, is undone after it
        if where == "after merging":
            real = compaction.merge_segments
            mp.setattr(compaction, "merge_segments", lambda *a, **k: (real(*a, **k), crash())[1])
        elif where == "while publishing" and kind == "hub":
            hub.fail["commit"] = 1  # the Hub refuses the commit that adds the merged segment
        elif where == "while publishing":
            from wvc.remotes.path import PathBackend

            mp.setattr(PathBackend, "_lock", crash)
        else:
            from wvc.remotes.path import PathBackend

            mp.setenv("WVC_REMOTE_GRACE_SECONDS", "0")
            real_delete = PathBackend.delete

            def half_delete(self, paths):
                real_delete(self, paths[:1])
                crash()

            mp.setattr(PathBackend, "delete", half_delete)
        expected = "403" if (kind, where) == ("hub", "while publishing") else "simulated crash"
        with pytest.raises(WvcError, match=expected):
            repo.push()
    if where != "while purging":
        check = clone(url, tmp_path / "check")
        assert check.head() == last_good and check.fsck().ok
    monkeypatch.setenv("WVC_REMOTE_GRACE_SECONDS", "0")
    trainer.commit("after the crash")
    repo.push()
    copy = clone(url, tmp_path / "copy")
    assert copy.head() == repo.head()
    assert tree_digests(copy.root) == tree_digests(repo.root) and copy.fsck().ok


@pytest.mark.parametrize("kind", ["path", "hub", "s3"])
def test_gc_remote_frees_a_deleted_branch_and_nothing_reachable(tmp_path, kind, hub, cli, monkeypatch, request):
    import json

    url = url_of(kind, tmp_path, request, "gc")
    repo = Repo.init(tmp_path / "a")
    trainer = TinyTrainer(repo)
    trainer.commit("base")
    repo.remote_add("origin", url)
    repo.push()
    repo.create_branch("exp")
    repo.checkout("exp")
    exp = TinyTrainer(repo, seed=99)  # an experiment with weights of its own
    for i in range(3):
        exp.commit(f"exp {i}")
    repo.push("origin", "exp")
    repo.checkout("main")
    trainer.commit("main 1")
    repo.push()
    before = clone(url, tmp_path / "before")
    remote = open_backend(url)
    state = remote.listing()
    remote.publish({}, {"refs/heads/exp": None}, state, "delete exp")  # the branch is deleted on the remote

    dry = json.loads(cli(repo.root, "gc", "--remote", "origin", "--dry-run", "--json").output)
    assert dry["dry_run"] and dry["objects_removed"] > 0 and dry["commits_removed"] == 3
    assert clone(url, tmp_path / "still").fsck().ok  # a dry run changes nothing
    res = repo.remote_gc("origin")
    assert res.objects_removed == dry["objects_removed"] and res.bytes_freed > 0
    monkeypatch.setenv("WVC_REMOTE_GRACE_SECONDS", "0")
    trainer.commit("main 2")
    repo.push()  # a directory remote deletes the retired files now
    after = clone(url, tmp_path / "after")
    assert after.fsck().ok and "origin/exp" not in after.remote_branches()
    after.checkout("main~1", output=tmp_path / "after-old")
    before.checkout("main", output=tmp_path / "before-main")
    assert tree_digests(tmp_path / "after-old") == tree_digests(tmp_path / "before-main")
    again = repo.remote_gc("origin", dry_run=True)
    assert again.objects_removed == 0 and again.commits_removed == 0
