"""The device path (#22), exercised on the CPU with the ``torch-cpu`` backend: a commit from a
state dict batched through codec/batched.py and codec/device_copy.py writes the C path's payloads
byte for byte; many chunks travel and are transformed per pass, not one at a time; loads and
follower updates copy a batch at a time; ``device="auto"`` picks the faster path measured.
What needs a GPU (CUDA streams, pinned memory, the speed) is measured by benchmarks/gpu.py."""

import pytest
import torch

import wvc
from wvc import Repo
from wvc.codec import device_copy
from wvc.codec import Method, batched
from wvc.codec import device_choice
from wvc.errors import CorruptObject
from wvc.read.tensors import tensors_on_device

from .conftest import random_tensor

CHUNK = 512 * 1024  # several chunks a tensor, all of them big enough to be sampled (>= 128 KiB)


def _versions():
    """Four versions covering every route: keyframes, dense steps (ULP_EXP), sparse steps
    (SPARSE), integer deltas, 1-byte dtypes, tensors too small for the device (tried in
    full on the host), a step given the step before (STEP_BLOCKS or STEP_RUNS, the host's), a tied tensor,
    an empty one, and a shape change."""
    g = torch.Generator().manual_seed(0)
    v0 = {
        "embed": (torch.randn(1024, 1024, generator=g) * 0.02).to(torch.bfloat16),
        "proj": torch.randn(300, 700, generator=g) * 0.05,
        "f16": (torch.randn(200_000, generator=g) * 0.1).to(torch.float16),
        "f64": torch.randn(40_000, generator=g, dtype=torch.float64),
        "i32": torch.randint(-1000, 1000, (150_000,), generator=g, dtype=torch.int32),
        "u8": torch.randint(0, 7, (300_000,), generator=g, dtype=torch.uint8),
        "fp8": random_tensor(torch.float8_e4m3fn, (260_000,), 3),
        "mask": torch.rand(200_000, generator=g) > 0.5,
        "norm": torch.ones(768, dtype=torch.bfloat16),
        "bias": torch.zeros(1000),
        "empty": torch.empty(0, 4),
        "grows": torch.randn(100, 1000, generator=g),
    }
    v0["tied"] = v0["embed"]
    versions = [v0]
    prev = v0
    for step in range(3):
        v = {k: t.clone() for k, t in prev.items()}
        if step == 0:  # dense: every float moves by about a learning rate
            for k in ("embed", "proj", "f16", "f64", "norm", "bias"):
                v[k] = (v[k].double() + torch.randn(v[k].shape, generator=g, dtype=torch.float64) * 1e-3
                        ).to(v[k].dtype)
            v["i32"] += torch.randint(-2, 3, v["i32"].shape, generator=g, dtype=torch.int32)
            v["grows"] = torch.cat([v["grows"], torch.randn(3, 1000, generator=g)])
        else:  # sparse: 1% of the elements, one unit in the last place (RL-like)
            for k in ("embed", "proj", "f16"):
                bits = v[k].view({2: torch.int16, 4: torch.int32}[v[k].element_size()]).reshape(-1)
                idx = torch.randint(0, bits.numel(), (bits.numel() // 100,), generator=g)
                bits[idx] += 1
            v["u8"][::97] ^= 1
            v["mask"][::101] = ~v["mask"][::101]
        v["tied"] = v["embed"]
        versions.append(v)
        prev = v
    return versions


def _commit_all(path, versions) -> list[str]:
    repo = Repo.init(path, chunk_bytes=CHUNK)
    commits = [repo.commit(f"v{i}", source=v).commit for i, v in enumerate(versions)]
    repo.close()
    return commits


@pytest.fixture
def uploads(monkeypatch):
    """The sizes of the parts of every DeviceCopies.to_device call, a list per call."""
    calls = []
    real = device_copy.DeviceCopies.to_device

    def spy(self, parts):
        calls.append([len(memoryview(p).cast("B")) for p in parts])
        return real(self, parts)

    monkeypatch.setattr(device_copy.DeviceCopies, "to_device", spy)
    return calls


def _payloads(repo):
    store = repo.internals.store
    return {oid: (row.method, row.base, bytes(store.reader.read(row.pack, row.offset, row.length)))
            for oid, row in store.rows(store.object_ids()).items()}


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(device_copy, "BATCH_BYTES", 3 << 20)  # several batches a commit


@pytest.fixture
def device_methods(monkeypatch):
    """The methods of every chunk the device pass encoded, and the passes' batch sizes."""
    seen = {"methods": [], "batches": []}
    real = batched.encode_on_device

    def spy(chunks, **kw):
        seen["methods"] += [c.method for c in chunks]
        seen["batches"].append(len(chunks))
        return real(chunks, **kw)

    monkeypatch.setattr(batched, "encode_on_device", spy)
    return seen


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (benchmarks/gpu_run.sh runs it there)")


@pytest.mark.parametrize("device", ["torch-cpu", pytest.param("cuda", marks=GPU)])
def test_a_device_commit_stores_the_c_paths_payloads_for_every_dtype_and_route(tmp_path, small_batches,
                                                                               device_methods, device):
    versions = _versions()
    if device == "cuda":  # the state dict in device memory, as a trainer's
        versions = [{k: t.to("cuda") for k, t in v.items()} for v in versions]
    trees = {}
    for device in ("cpu", device):
        repo = Repo.init(tmp_path / device, chunk_bytes=CHUNK)
        trees[device] = [repo.commit(f"v{i}", source=v, device=device).tree for i, v in enumerate(versions)]
        if device == "cpu":
            assert device_methods["methods"] == []  # the C path never takes the device pass
            on_cpu = _payloads(repo)
        else:
            on_device = _payloads(repo)
        repo.close()
    assert trees["cpu"] == trees[device]
    assert on_device.keys() == on_cpu.keys()
    assert all(on_device[k] == on_cpu[k] for k in on_cpu)  # method, base and payload bytes
    methods = set(device_methods["methods"])
    assert {Method.PLANES, Method.RAW, Method.ULP_EXP, Method.SPARSE} <= methods, methods
    assert methods & {Method.XOR, Method.SUB}, methods  # the integer deltas
    stored = {m for m, _, _ in on_cpu.values()}
    assert stored & {Method.STEP_BLOCKS, Method.STEP_RUNS}  # (the host's) -- the route that never reaches the device pass
    assert not {m for m in methods if Method(m).uses_context}
    # and every version loads back bit for bit from the device-made repository
    repo = Repo.open(tmp_path / device)
    for i, v in enumerate(versions):
        got = repo.load_state_dict(f"HEAD~{len(versions) - 1 - i}", device="cuda" if device == "cuda" else "cpu")
        assert all(torch.equal(got[k].view(torch.uint8), v[k].contiguous().view(torch.uint8)) for k in v)
    repo.close()


def test_many_small_tensors_are_transformed_a_batch_a_pass_not_a_chunk_at_a_time(tmp_path, small_batches,
                                                                                device_methods, monkeypatch):
    g = torch.Generator().manual_seed(1)
    v0 = {f"layer{i}.w": (torch.randn(160, 512, generator=g) * 0.02).to(torch.bfloat16) for i in range(120)}
    v1 = {k: (t.float() + torch.randn(t.shape, generator=g) * 1e-3).to(torch.bfloat16) for k, t in v0.items()}
    uploads = []
    real_upload = device_copy.DeviceCopies.upload

    def count(self, staging):
        uploads.append(staging.numel())
        return real_upload(self, staging)

    repo = Repo.init(tmp_path / "r", chunk_bytes=CHUNK)
    repo.commit("v0", source=v0, device="torch-cpu")
    device_methods["batches"].clear()
    monkeypatch.setattr(device_copy.DeviceCopies, "upload", count)
    repo.commit("v1", source=v1, device="torch-cpu")
    total = sum(t.numel() * 2 for t in v1.values())  # 19.7 MB in 120 tensors of 160 KiB
    passes = device_methods["batches"]
    assert sum(passes) == 120  # every chunk went through the device pass ...
    assert len(passes) <= total // (3 << 20) + 1  # ... in a pass per batch, not one per chunk
    assert len(uploads) == len(passes) and sum(uploads) == total  # the bases: one copy up per batch
    repo.close()


def test_a_failure_inside_a_device_batch_leaves_the_repository_as_it_was(tmp_path, small_batches, monkeypatch):
    versions = _versions()
    repo = Repo.init(tmp_path / "r", chunk_bytes=CHUNK)
    repo.commit("v0", source=versions[0], device="torch-cpu")
    head, objects = repo.head(), repo.internals.store.count_objects()
    calls = {"n": 0}
    real = batched.compress_stream

    def fail_late(data, level):
        calls["n"] += 1
        if calls["n"] == 40:
            raise OSError("disk gone")
        return real(data, level)

    monkeypatch.setattr(batched, "compress_stream", fail_late)
    with pytest.raises(OSError):
        repo.commit("v1", source=versions[1], device="torch-cpu")
    assert repo.head() == head and repo.internals.store.count_objects() == objects
    monkeypatch.setattr(batched, "compress_stream", real)
    done = repo.commit("v1", source=versions[1], device="torch-cpu")
    assert repo.head() == done.commit
    repo.close()


def test_loads_onto_a_device_copy_a_batch_at_a_time_and_check_sizes(tmp_path, monkeypatch):
    versions = _versions()
    repo = Repo.init(tmp_path / "r", chunk_bytes=CHUNK)
    commit = repo.commit("v0", source=versions[0]).commit
    entries = {t.name: t for f in repo.tree_of(commit).files for t in f.tensors}
    copies = []
    real = device_copy.DeviceCopies.into

    def count(self, regions, parts, map=map):
        copies.append(len(regions))
        return real(self, regions, parts, map)

    monkeypatch.setattr(device_copy.DeviceCopies, "into", count)
    got = tensors_on_device(repo.internals.store, entries, "cpu", batch_bytes=2 << 20)
    assert all(torch.equal(got[k].view(torch.uint8), versions[0][k].contiguous().view(torch.uint8)) for k in entries)
    chunks = sum(len(e.chunks) for e in entries.values())
    total = sum(e.nbytes for e in entries.values())
    assert sum(copies) == chunks and len(copies) <= total // (2 << 20) + 1 < chunks
    # a tree whose chunk list does not add up to the tensor's shape is refused, not copied short
    e = entries["embed"]
    short = type(e)(e.name, e.dtype, e.shape, e.chunks[:-1])
    with pytest.raises(CorruptObject):
        tensors_on_device(repo.internals.store, {"embed": short}, "cpu")
    repo.close()


def test_a_follower_uploads_many_changed_chunks_in_one_copy(tmp_path, uploads, monkeypatch):
    import wvc.read.follower as follower_module

    monkeypatch.setattr(follower_module, "_written_from_host", lambda region: False)  # (the device path, on the host)
    versions = _versions()
    commits = _commit_all(tmp_path / "r", versions)
    follower = wvc.follow(tmp_path / "r")
    for commit, v in zip(commits, versions):
        uploads.clear()
        update = follower.update(rev=commit)
        assert all(torch.equal(follower.state_dict[k].view(torch.uint8), v[k].contiguous().view(torch.uint8))
                   for k in v if v[k].numel())
        assert update is not None and len(uploads) < sum(map(len, uploads))  # chunks of many tensors per copy


def test_a_follower_on_the_host_writes_decoded_chunks_without_staging_them(tmp_path, uploads):
    """Into host tensors the decoded bytes are copied from where they lie: staged into a
    fresh buffer a batch first (the device path's pinned upload), a fifth of a CPU engine's
    update went to that copy (issue 65)."""
    versions = _versions()
    commits = _commit_all(tmp_path / "r", versions)
    follower = wvc.follow(tmp_path / "r")
    for commit, v in zip(commits, versions):
        update = follower.update(rev=commit)
        assert update is not None and all(
            torch.equal(follower.state_dict[k].view(torch.uint8), v[k].contiguous().view(torch.uint8))
            for k in v if v[k].numel())
    assert uploads == []


def test_device_copies_keep_order_and_bytes_on_the_host_backend():
    copies = device_copy.DeviceCopies("cpu")
    parts = [torch.arange(n, dtype=torch.int16) for n in (5, 0, 70_000, 1)]
    host = copies.gather_to_host(parts)()
    assert [h.tobytes() for h in host] == [p.numpy().tobytes() for p in parts]
    up = copies.to_device([h for h in host])
    assert [u.numpy().tobytes() for u in up] == [p.numpy().tobytes() for p in parts]
    regions = [torch.zeros(len(h), dtype=torch.uint8) for h in host]
    copies.into(regions, host)
    assert [r.numpy().tobytes() for r in regions] == [p.numpy().tobytes() for p in parts]


class _Clock:
    """A clock the runs advance by what they say they cost (no timing of real work)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_auto_keeps_the_path_measured_faster_and_the_c_path_when_they_disagree():
    clock = _Clock()

    def run(cost, payloads):
        def go():
            clock.now += cost
            return payloads
        return go

    assert device_choice.fastest({"cuda": run(1.0, [b"a"]), "cpu": run(3.0, [b"a"])}, clock=clock) == "cuda"
    assert device_choice.fastest({"cuda": run(2.0, [b"a"]), "cpu": run(1.5, [b"a"])}, clock=clock) == "cpu"
    # a path that wrote other bytes is never chosen, however fast
    assert device_choice.fastest({"cuda": run(0.1, [b"x"]), "cpu": run(9.0, [b"a"])}, clock=clock) == "cpu"


def test_auto_measures_once_per_process_and_source_kind_and_not_at_all_without_a_gpu(monkeypatch):
    from wvc.codec import devices

    trials = []

    def fake_trial(device, location):
        trials.append((device, location))
        return lambda: [b"same"]

    monkeypatch.setattr(device_choice, "_trial", fake_trial)
    monkeypatch.setattr(device_choice, "_CHOSEN", {})
    monkeypatch.setattr(devices, "_cuda_usable", lambda: False)
    assert device_choice.commit_device("auto", "device") == "cpu" and trials == []
    monkeypatch.setattr(devices, "_cuda_usable", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    first = device_choice.commit_device("auto", "device")
    assert first in ("cuda", "cpu") and sorted(trials) == [("cpu", "device"), ("cuda", "device")]
    assert device_choice.commit_device("auto", "device") == first and len(trials) == 2  # kept
    device_choice.commit_device("auto", "files")
    assert len(trials) == 4  # another kind of source is measured on its own
    assert device_choice.commit_device("cpu", "device") == "cpu" and len(trials) == 4  # asked for: not measured


@pytest.mark.parametrize("location", ["host", "files"])
def test_the_auto_trials_run_both_paths_and_write_the_same_bytes(location):
    device_run, c_run = device_choice._trial("torch-cpu", location), device_choice._trial("cpu", location)
    a, b = device_run(), c_run()
    assert len(a) == 4 and a == b


def test_data_location_tells_device_host_and_files_apart():
    assert device_choice.data_location({"w": torch.zeros(2)}) == "host"
    assert device_choice.data_location("/some/dir") == "files" and device_choice.data_location(None) == "files"
    assert device_choice.data_location({"w": torch.zeros(2, device="meta")}) == "host"


@pytest.fixture
def mirrored(monkeypatch):
    """The follower treats host tensors as it treats device ones: host copies of their
    chunks, and patches of only the changed elements (how the patch path runs here)."""
    from wvc.read import follower as follower_module

    monkeypatch.setattr(follower_module, "_mirrored", lambda tensor: True)
    return follower_module


def _rl_versions(steps: int = 3):
    g = torch.Generator().manual_seed(5)
    v = {f"w{i}": (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(4)}
    v["f32"] = torch.randn(100_000, generator=g)
    out = [v]
    for _ in range(steps):
        v = {k: t.clone() for k, t in v.items()}
        for k in ("w0", "w2", "f32"):  # 1% of the elements, one unit in the last place
            bits = v[k].view(torch.int16 if v[k].element_size() == 2 else torch.int32).reshape(-1)
            bits[torch.randint(0, bits.numel(), (bits.numel() // 100,), generator=g)] += 1
        out.append(v)
    return out


def test_a_device_follower_sends_only_the_changed_elements_of_a_sparse_step(tmp_path, mirrored, uploads):
    versions = _rl_versions()
    commits = _commit_all(tmp_path / "r", versions)
    given = {k: torch.zeros_like(t) for k, t in versions[0].items()}
    follower = wvc.follow(tmp_path / "r", state_dict=given)
    for n, (commit, v) in enumerate(zip(commits, versions)):
        uploads.clear()
        follower.update(rev=commit)
        assert all(torch.equal(given[k].view(torch.uint8), v[k].view(torch.uint8)) for k in v)  # in place, exact
        changed = sum(v[k].numel() * v[k].element_size() for k in ("w0", "w2", "f32"))
        if n:  # the changed tensors' chunks cross as ~1% of their elements, positions and values
            assert sum(map(sum, uploads)) < changed / 10, (uploads, changed)
    # the bases the deltas decode against came from the host copies: none was read back
    assert set(follower._mirror) == {c for f in Repo.open(tmp_path / "r").tree_of(commits[-1]).files
                                     for t in f.tensors for c in t.chunks}


def test_an_interrupt_while_patching_restores_every_tensor(tmp_path, mirrored, monkeypatch):
    versions = _rl_versions(1)
    first, second = _commit_all(tmp_path / "r", versions)
    given = {k: torch.zeros_like(t) for k, t in versions[0].items()}
    follower = wvc.follow(tmp_path / "r", state_dict=given)
    follower.update(rev=first)
    writes = []
    real = mirrored._write_chunk

    def interrupted(region, new):
        writes.append(1)
        if len(writes) == 3:
            raise KeyboardInterrupt
        real(region, new)

    monkeypatch.setattr(mirrored, "_write_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        follower.update(rev=second)
    assert follower.commit == first
    assert all(torch.equal(given[k].view(torch.uint8), versions[0][k].view(torch.uint8)) for k in given)
    monkeypatch.setattr(mirrored, "_write_chunk", real)
    follower.update(rev=second)
    assert all(torch.equal(given[k].view(torch.uint8), versions[1][k].view(torch.uint8)) for k in given)
