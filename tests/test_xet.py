"""The Hub as users reach it: Xet. The local Hub server's CAS is checked with plain HTTP
(what it refuses) and with the real hf_xet client (what it accepts, unchanged); every Hub
operation of wvc runs on the Xet path and on the LFS path (``HF_HUB_DISABLE_XET=1``)."""

import hashlib
import json

import pytest
import torch
from huggingface_hub import CommitOperationAdd, HfApi, get_session, hf_hub_download
from safetensors.torch import save_file

import wvc
from wvc import Repo, clone
from wvc.testing import xet_format as xf

from .conftest import TOKEN, tree_digests, use_lfs_path
from .test_base_model import fine_tune, publish_base

pytestmark = pytest.mark.usefixtures("hub_env")


# -- the format, against the specification's and the reference client's own vectors ------------
def test_hashes_match_the_reference_vectors():
    # api.md: the hash [0, 1, ..., 31] is written as the bytes [7, 6, ..., 0, 15, ..., 8, ...] in hex
    # (the spec's own example string drops the "10" of the third word: it has 62 characters)
    reordered = [i for word in range(4) for i in range(word * 8 + 7, word * 8 - 1, -1)]
    assert xf.hash_hex(bytes(range(32))) == bytes(reordered).hex()
    assert xf.hex_hash(xf.hash_hex(bytes(range(32)))) == bytes(range(32))
    # xet-core merklehash/src/aggregated_hashes.rs test_correctness: (hash, size) lists -> xorb hash, file hash
    a = xf.hex_hash("cfc5d07f6f03c29bbf424132963fe08d19a37d5757aaf520bf08119f05cd56d6")
    b = xf.hex_hash("c3e67584b5c4fc2a89837ec39e40f2c8a6bb0b2987ac94cd4b31e5fbdd210a72")
    c = xf.hex_hash("0d2beb91b9196929a5ddec9f6e306924ddf4a24268e3e59fd8464738d525af37")
    d = xf.hex_hash("adf8773496a9b7319b2e50dc98093f344053b17d8ad37100b9c07d9805988784")
    three = [(a, 100), (b, 200), (c, 300)]
    assert xf.hash_hex(xf.merkle_root(three)) == "71ec1275fca074724e2dd666921b3277c7cee603e4d025bcab2d4050015be2bc"
    assert xf.hash_hex(xf.file_hash(three)) == "54e55dccc6653c612bdb5576c5d3cb34bb31bc4e100248abccf4c908b3ef7715"
    six = [(a, 100), (b, 200), (a, 100), (b, 200), (c, 300), (d, 400)]
    assert xf.hash_hex(xf.merkle_root(six)) == "52c826f99507aa05d0b45e9837fa1709e0485425cfbcb1e80db3905cf98b3ee9"
    assert xf.merkle_root([]) == bytes(32)


# -- the CAS over plain HTTP: what it refuses ---------------------------------------------------
def _token(hub, repo: str, scope: str) -> tuple[str, str]:
    r = get_session().get(f"{hub.base_url}/api/models/{repo}/xet-{scope}-token/main",
                          headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert r.headers["X-Xet-Cas-Url"] == r.json()["casUrl"] and r.headers["X-Xet-Access-Token"] == r.json()["accessToken"]
    return r.json()["casUrl"], r.json()["accessToken"]


def _chunks(seed: int, n: int = 3) -> list[bytes]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (1000 + 500 * i,), dtype=torch.uint8, generator=g).numpy().tobytes() for i in range(n)]


def _xorb_hash(chunks: list[bytes]) -> str:
    return xf.hash_hex(xf.merkle_root([(xf.chunk_hash(c), len(c)) for c in chunks]))


def _file(chunks: list[bytes], xorb: str, *, sha256: str | None = None, check: bytes | None = None) -> xf.FileInfo:
    hashes = [xf.chunk_hash(c) for c in chunks]
    term = xf.Term(xf.hex_hash(xorb), sum(map(len, chunks)), 0, len(chunks),
                   check if check is not None else xf.verification_hash(hashes))
    sha = sha256 or hashlib.sha256(b"".join(chunks)).hexdigest()
    return xf.FileInfo(xf.file_hash([(h, len(c)) for h, c in zip(hashes, chunks)]), (term,), xf.hex_hash(sha))


def test_the_cas_refuses_a_xorb_whose_hash_is_not_its_body(hub):
    HfApi(endpoint=hub.base_url, token=TOKEN).create_repo("team/xorbs", exist_ok=True)
    cas, token = _token(hub, "team/xorbs", "write")
    auth = {"Authorization": f"Bearer {token}"}
    chunks = _chunks(1)
    body, right = xf.serialize_xorb(chunks), _xorb_hash(chunks)
    wrong = _xorb_hash(_chunks(2))
    r = get_session().post(f"{cas}/v1/xorbs/default/{wrong}", content=body, headers=auth)
    assert r.status_code == 400 and "hash mismatch" in r.text
    r = get_session().post(f"{cas}/v1/xorbs/default/{right}", content=body[:-40], headers=auth)  # cut short
    assert r.status_code == 400
    assert not hub.storage.xet.xorb_path(wrong).exists() and hub.storage.xet.xorb_chunks(right) is None
    r = get_session().post(f"{cas}/v1/xorbs/default/{right}", content=body, headers=auth)
    assert r.status_code == 200 and r.json() == {"was_inserted": True}
    assert get_session().post(f"{cas}/v1/xorbs/default/{right}", content=body, headers=auth).json() == {"was_inserted": False}
    # tokens: none is 401; a read token may not upload
    assert get_session().post(f"{cas}/v1/xorbs/default/{right}", content=body).status_code == 401
    _, read_token = _token(hub, "team/xorbs", "read")
    r = get_session().post(f"{cas}/v1/xorbs/default/{right}", content=body, headers={"Authorization": f"Bearer {read_token}"})
    assert r.status_code == 403


def test_the_cas_refuses_a_shard_that_does_not_verify(hub):
    HfApi(endpoint=hub.base_url, token=TOKEN).create_repo("team/shards", exist_ok=True)
    cas, token = _token(hub, "team/shards", "write")
    auth = {"Authorization": f"Bearer {token}"}
    chunks = _chunks(3)
    xorb = _xorb_hash(chunks)
    missing = _xorb_hash(_chunks(4))  # never uploaded
    assert get_session().post(f"{cas}/v1/xorbs/default/{xorb}", content=xf.serialize_xorb(chunks), headers=auth).status_code == 200

    def post(version: str, files) -> tuple[int, str]:
        r = get_session().post(f"{cas}/{version}/shards", content=xf.serialize_shard(files), headers=auth)
        return r.status_code, r.text

    status, text = post("v1", [_file(chunks, missing)])
    assert status == 400 and "does not hold" in text
    status, text = post("v2", [_file(chunks, missing)])  # streamed: 200, and the last event is the error
    assert status == 200 and json.loads(text.splitlines()[-1])["type"] == "error" and "does not hold" in text
    assert post("v1", [_file(chunks, xorb, check=bytes(32))]) [0] == 400  # a wrong verification hash
    assert post("v1", [_file(chunks, xorb, sha256="00" * 32)])[0] == 400  # sha256 metadata of other content
    bad_tag = b"X" + xf.serialize_shard([_file(chunks, xorb)])[1:]
    assert get_session().post(f"{cas}/v1/shards", content=bad_tag, headers=auth).status_code == 400
    file_id = xf.hash_hex(_file(chunks, xorb).hash)
    assert hub.storage.xet.file_record(file_id) is None  # nothing of the refused shards was recorded

    status, text = post("v1", [_file(chunks, xorb)])
    assert status == 200 and json.loads(text) == {"result": 1}
    # and the file it recorded reconstructs, whole and by range (v1 and v2 forms)
    data = b"".join(chunks)
    for version, key in (("v1", "fetch_info"), ("v2", "xorbs")):
        r = get_session().get(f"{cas}/{version}/reconstructions/{file_id}", headers={**auth, "Range": "bytes=1200-2999"})
        answer = r.json()
        assert r.status_code == 200 and [t["range"] for t in answer["terms"]] == [{"start": 1, "end": 3}]  # chunks of 1000, 1500, 2000 bytes
        entry = answer[key][xorb][0]
        lo, hi = (entry["ranges"][0]["bytes"] if version == "v2" else entry["url_range"]).values()
        assert get_session().get(entry["url"]).status_code == 403  # a transfer URL is read with its Range
        raw = get_session().get(entry["url"], headers={"Range": f"bytes={lo}-{hi}"}).content
        got = b"".join(part for _, part in xf.read_chunks(raw))
        start = answer["offset_into_first_range"]
        assert got[start:start + 1800] == data[1200:3000]
    r = get_session().get(f"{cas}/v1/reconstructions/{file_id}", headers={**auth, "Range": f"bytes={len(data)}-"})
    assert r.status_code == 416


# -- the real client: what it uploads is accepted and reads back ---------------------------------
def test_a_file_committed_through_xet_reads_back_identically_every_way(hub, tmp_path):
    api = HfApi(endpoint=hub.base_url, token=TOKEN)
    api.create_repo("team/xetfile", exist_ok=True)
    g = torch.Generator().manual_seed(5)
    data = torch.randint(0, 256, (3_000_000,), dtype=torch.uint8, generator=g).numpy().tobytes() + bytes(1_000_000)
    before = len(hub.requests)
    api.create_commit("team/xetfile", [CommitOperationAdd("weights.pack", data)], commit_message="xet")
    uploads = [p for m, p in hub.requests[before:] if m == "POST" and p.startswith("[cas]")]
    assert any("/xorbs/" in p for p in uploads) and any(p.endswith("/shards") for p in uploads)
    assert not any("/upload/" in p or "info/lfs" in p for _, p in hub.requests[before:])  # not LFS
    (entry,) = [e for e in api.list_repo_tree("team/xetfile") if e.path == "weights.pack"]
    assert entry.xet_hash and entry.lfs.sha256 == hashlib.sha256(data).hexdigest()

    before = len(hub.requests)
    path = hf_hub_download("team/xetfile", "weights.pack", cache_dir=tmp_path / "c1", endpoint=hub.base_url)
    assert hashlib.sha256(open(path, "rb").read()).digest() == hashlib.sha256(data).digest()
    assert any("reconstructions" in p for _, p in hub.requests[before:])  # through Xet
    # a plain range GET of /resolve/ follows the Hub's redirect to the reconstructed bytes
    r = get_session().get(f"{hub.base_url}/team/xetfile/resolve/main/weights.pack", follow_redirects=True,
                          headers={"Authorization": f"Bearer {TOKEN}", "Range": "bytes=2999990-3000009"})
    assert r.status_code == 206 and r.content == data[2999990:3000010]


# -- every Hub operation of wvc, on both paths ---------------------------------------------------
def _weights(step: int) -> dict:
    g = torch.Generator().manual_seed(0)
    w = {f"layer{i}.weight": (torch.randn(512, 256, generator=g) * 0.02).to(torch.bfloat16) for i in range(3)}
    w["layer1.weight"].view(torch.int16).reshape(-1)[step::97] += 1
    return w


@pytest.mark.parametrize("path", ["xet", "lfs", "bucket"])
def test_every_hub_operation_on_the_xet_and_lfs_paths(tmp_path, hub, monkeypatch, cli, path):
    """The same verbs on a model repo through Xet, through LFS, and on a Storage Bucket."""
    if path == "lfs":
        use_lfs_path(monkeypatch)
    monkeypatch.setenv("WVC_CACHE", str(tmp_path / "wvc-cache"))
    base, base_folder = publish_base(hub, tmp_path, name=f"org/base-{path}-{tmp_path.name}")
    before = len(hub.requests)
    repo = Repo.init(tmp_path / "a", base=f"hf://{base}")  # the base downloaded over the path under test
    base_reads = [p for _, p in hub.requests[before:] if "reconstructions" in p]
    assert bool(base_reads) == (path != "lfs")
    url = f"hf://buckets/team/ops-{tmp_path.name}/run" if path == "bucket" else f"hf://team/ops-{path}-{tmp_path.name}"
    repo.remote_add("origin", url)
    digests = {}
    for step in range(3):
        fine_tune(base_folder, repo.root, seed=step + 1)
        save_file(_weights(step), str(repo.root / "extra.safetensors"))
        digests[repo.commit(f"step {step}").commit] = tree_digests(repo.root)
    before = len(hub.requests)
    repo.push("origin", "main")
    cas = [p for _, p in hub.requests[before:] if p.startswith("[cas]")]
    assert bool(cas) == (path != "lfs")  # the pack went up through Xet, or through LFS and nothing else

    copy = clone(url, tmp_path / "b")  # clone; the base again from its own repo
    assert tree_digests(copy.root) == digests[repo.head()]
    for commit, expected in digests.items():
        copy.checkout(commit)
        assert tree_digests(copy.root) == expected
    copy.checkout("main")

    lazy = clone(url, tmp_path / "lazy", lazy=True)
    assert tree_digests(lazy.root) == digests[repo.head()]

    view = wvc.open(url, "main")
    assert torch.equal(view.tensor("layer1.weight").view(torch.int16), _weights(2)["layer1.weight"].view(torch.int16))
    snap = wvc.snapshot_download(url)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in snap.iterdir() if p.is_file()} == \
        {k: v for k, v in digests[repo.head()].items() if "/" not in k}

    follower = wvc.follow(url)
    assert follower.update(timeout=30).commit == repo.head()
    fine_tune(base_folder, repo.root, seed=9)
    digests[repo.commit("step 3").commit] = tree_digests(repo.root)
    repo.push("origin", "main")
    assert follower.update(timeout=30).commit == repo.head()
    assert all(torch.equal(v.view(torch.uint8) if v.dtype == torch.bool else v, follower.state_dict[k])
               for k, v in repo.load_state_dict(repo.head()).items())

    copy.fetch("origin")
    copy.pull("origin")
    assert tree_digests(copy.root) == digests[repo.head()]

    # gc --remote: a branch pushed and deleted on the remote leaves its commit unreachable there
    main_head = repo.head()
    repo.create_branch("exp")
    repo.checkout("exp")
    fine_tune(base_folder, repo.root, seed=11)
    repo.commit("experiment")
    repo.push("origin", "exp")
    repo.delete_remote_branch("origin", "exp")
    result = cli(repo.root, "gc", "--remote", "origin", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["commits_removed"] == 1
    again = clone(url, tmp_path / "c")
    assert again.head() == main_head and tree_digests(again.root) == digests[main_head]
    assert again.fsck().ok


def test_an_lfs_only_endpoint_is_named_as_such(tmp_path, hub, cli):
    repo = Repo.init(tmp_path / "m")
    save_file(_weights(0), str(repo.root / "model.safetensors"))
    repo.commit("one")
    repo.remote_add("origin", f"hf://team/lfs-only-{tmp_path.name}")
    hub.speaks_xet = False
    try:
        result = cli(repo.root, "push")
    finally:
        hub.speaks_xet = True
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "does not speak Xet" in lines[-1] and "HF_HUB_DISABLE_XET=1" in lines[-1], result.output
    assert "cannot reach" not in result.output and "Traceback" not in result.output


def test_the_xet_service_rate_limiting_is_waited_out(tmp_path, hub, monkeypatch):
    """The CAS answers 429 over its own request quota (xorb and shard uploads, reconstructions,
    transfers); hf_xet and wvc wait it out: the push lands and the clone is byte-identical."""
    from wvc.testing.hub import Quota

    repo = Repo.init(tmp_path / "a")
    for step in range(2):
        save_file(_weights(step), str(repo.root / "model.safetensors"))
        repo.commit(f"step {step}")
    url = f"hf://team/cas-quota-{tmp_path.name}"
    repo.remote_add("origin", url)
    monkeypatch.setenv("WVC_HUB_MAX_WAIT", "60")
    hub.cas_quota = Quota(5, 1.0)  # hf_xet sends bursts (a dedup query a chunk, in parallel): some get 429
    try:
        repo.push()
        copy = clone(url, tmp_path / "b")
        snap = wvc.snapshot_download(url, cache_dir=tmp_path / "snap")
        rejected = hub.cas_quota.rejected
    finally:
        hub.cas_quota = None
    assert rejected > 0  # the quota did bite
    assert tree_digests(copy.root) == tree_digests(repo.root)
    assert hashlib.sha256((snap / "model.safetensors").read_bytes()).digest() == \
        hashlib.sha256((repo.root / "model.safetensors").read_bytes()).digest()
