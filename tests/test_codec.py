"""Every codec method round-trips bit-exactly, and decoding is bounded and checked."""

import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from wvc import codec
from wvc.codec import native
from wvc.codec.container import ROTATED, Method, compress_stream, pack, peek
from wvc.codec.transforms import applicable_methods, planes_param
from wvc.errors import CorruptObject
from wvc.formats.dtypes import BYTES, DTYPES

SPECIAL_BF16 = [0x7FC0, 0x7FC1, 0xFFFF, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x7F7F]


def test_float_keyframes_rotate_the_sign_out_of_the_exponent_byte():
    """PLANES of bf16 weights rotates each element (sign to bit 0), which is what makes the
    exponent byte compress better; a payload written without the rotation (parameter 0, as
    wvc wrote before) still decodes."""
    g = torch.Generator().manual_seed(3)
    weights = (torch.randn(1 << 18, generator=g) * 0.02).to(torch.bfloat16)
    raw = weights.view(torch.int16).numpy().tobytes()
    dtype = DTYPES["BF16"]
    rotated = codec.encode(raw, dtype, None)
    assert peek(rotated.payload).param == ROTATED == planes_param(dtype)
    assert planes_param(DTYPES["I16"]) == 0 and planes_param(DTYPES["F8_E4M3"]) == 0
    u = memoryview(raw)
    plain = pack(Method.PLANES, 2, 0, len(raw), [compress_stream(bytes(u[k::2]), 1) for k in range(2)])
    assert codec.decode(plain, len(raw)) == raw
    assert len(rotated.payload) < len(plain) * 0.995


def methods_for(dtype):
    return applicable_methods(dtype, True)


@settings(max_examples=60, deadline=None)
@given(
    dtype_name=hs.sampled_from(sorted(DTYPES)),
    data=hs.data(),
)
def test_every_method_round_trips_random_bit_patterns(dtype_name, data):
    dtype = DTYPES[dtype_name]
    n = data.draw(hs.integers(0, 300))
    raw = data.draw(hs.binary(min_size=n * dtype.width, max_size=n * dtype.width))
    base = data.draw(hs.binary(min_size=n * dtype.width, max_size=n * dtype.width))
    for method in methods_for(dtype):
        enc = codec.encode(raw, dtype, base if method.uses_base else None, method=method)
        assert enc.method == method
        assert codec.decode(enc.payload, len(raw), base if method.uses_base else None) == raw


def test_special_values_round_trip_through_ulp_delta():
    """NaN payloads, -0.0, inf and subnormals, as value and as base, survive exactly."""
    vals = torch.tensor(SPECIAL_BF16 * 10, dtype=torch.int32).to(torch.int16)
    raw = vals.numpy().tobytes()
    base = vals.flip(0).numpy().tobytes()
    for method in (Method.ULP, Method.ULP_EXP, Method.XOR, Method.PLANES):
        enc = codec.encode(raw, DTYPES["BF16"], base if method.uses_base else None, method=method)
        assert codec.decode(enc.payload, len(raw), base if method.uses_base else None) == raw


@pytest.mark.parametrize("name", ["BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2"])
def test_exponent_grouped_delta_round_trips_across_many_groups(name):
    """Weights spanning many exponents split into several groups; decode restores the order."""
    dtype = DTYPES[name]
    torch_dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                   "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}[name]
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200_000, generator=g, dtype=torch.float64) * torch.logspace(-6, 1, 200_000, dtype=torch.float64)
    a = w.to(torch_dtype)
    b = (w + torch.randn(200_000, generator=g, dtype=torch.float64) * 1e-4).to(torch_dtype)
    ra, rb = a.view(torch.uint8).numpy().tobytes(), b.view(torch.uint8).numpy().tobytes()
    enc = codec.encode(rb, dtype, ra, method=Method.ULP_EXP)
    assert len(peek(enc.payload).streams) > dtype.width  # more than one group
    assert codec.decode(enc.payload, len(rb), ra) == rb


def test_delta_beats_full_on_a_small_update():
    w = torch.randn(1 << 16) * 0.02
    a = w.to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    b = (w + torch.randn(1 << 16) * 1e-4).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    full = codec.encode(b, DTYPES["BF16"])
    delta = codec.encode(b, DTYPES["BF16"], a)
    assert delta.uses_base
    assert len(delta.payload) < len(full.payload) / 2


def test_large_chunk_sampled_selection_still_round_trips():
    w = torch.randn(1 << 20) * 0.02
    a = w.to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    b = (w + torch.randn(1 << 20) * 1e-4).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    enc = codec.encode(b, DTYPES["BF16"], a)
    assert codec.decode(enc.payload, len(b), a if enc.uses_base else None) == b


def bf16_pair_with_changed_share(share: float, n: int = 1 << 18, seed: int = 0):
    """(new, base) bf16 chunks where ``share`` of the elements differ by one unit in the last place."""
    g = torch.Generator().manual_seed(seed)
    base = (torch.randn(n, generator=g) * 0.02).to(torch.bfloat16).view(torch.int16)
    new = base.clone()
    moved = torch.rand(n, generator=g) < share
    new[moved] += 1
    return new.view(torch.uint8).numpy().tobytes(), base.view(torch.uint8).numpy().tobytes()


def encoded_methods(monkeypatch) -> list:
    """Records every method the encoder encodes with (trials included), on either path."""
    from wvc.codec import transforms

    tried = []
    real_native, real_backend = transforms._encode_native, transforms._encode_with
    monkeypatch.setattr(transforms, "_encode_native", lambda m, *a: tried.append(m) or real_native(m, *a))
    monkeypatch.setattr(transforms, "_encode_with", lambda xp, m, *a: tried.append(m) or real_backend(xp, m, *a))
    return tried


def test_sparse_is_not_tried_on_a_mostly_changed_chunk(monkeypatch):
    tried = encoded_methods(monkeypatch)
    new, base = bf16_pair_with_changed_share(0.7)
    enc = codec.encode(new, DTYPES["BF16"], base)
    assert Method.SPARSE not in tried and enc.method is Method.ULP_EXP
    assert codec.decode(enc.payload, len(new), base) == new
    tried.clear()
    new, base = bf16_pair_with_changed_share(0.01)
    assert codec.encode(new, DTYPES["BF16"], base).method is Method.SPARSE
    assert Method.SPARSE in tried


def test_a_dense_steps_clearly_best_delta_is_encoded_once_without_a_trial(monkeypatch):
    """A dense step's chunk (SPARSE cut, one delta left) is encoded in full with that delta
    first and kept when it is clearly best: no trial encode on the sample (it cost a fifth
    of a many-tensor fine-tune's encode time, #21). A delta that is not clearly best still
    goes through the trials, and the device path's choice defers to the host's there."""
    from wvc.codec.transforms import chosen_method

    tried = encoded_methods(monkeypatch)
    new, base = bf16_pair_with_changed_share(0.7)
    enc = codec.encode(new, DTYPES["BF16"], base)
    assert enc.method is Method.ULP_EXP and tried == [Method.ULP_EXP]  # one encode: the payload
    assert chosen_method(new, DTYPES["BF16"], base) is Method.ULP_EXP
    g = torch.Generator().manual_seed(5)
    unrelated = (torch.randn(1 << 18, generator=g) * 0.02).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    tried.clear()
    enc = codec.encode(new, DTYPES["BF16"], unrelated)
    assert enc.method is Method.PLANES and tried[0] is Method.ULP_EXP and Method.PLANES in tried[1:]
    assert chosen_method(new, DTYPES["BF16"], unrelated) is None  # the host's: it depends on the full delta


def test_a_chunk_against_an_unrelated_base_is_stored_in_full():
    """Re-initialised weights: every element changed and the delta is no smaller than the
    value, so the full encoding wins the (short) trial."""
    g = torch.Generator().manual_seed(5)
    base, new = ((torch.randn(1 << 19, generator=g) * 0.02).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
                 for _ in range(2))
    enc = codec.encode(new, DTYPES["BF16"], base)
    assert enc.method is Method.PLANES and not enc.uses_base
    assert codec.decode(enc.payload, len(new)) == new


@pytest.mark.parametrize("share", [0.01, 0.55, 0.65, 1.0])
def test_every_path_selects_the_same_method(share):
    """Selection (the sampled trials, and the cut-off on the changed share) is made alike by
    the C kernels, numpy and torch, so they write the same payload."""
    new, base = bf16_pair_with_changed_share(share, seed=3)
    payloads = {"torch": codec.encode(new, DTYPES["BF16"], base, device="torch-cpu").payload}
    kernels = native.kernels
    payloads["default"] = codec.encode(new, DTYPES["BF16"], base).payload
    native.kernels = None
    try:
        payloads["numpy"] = codec.encode(new, DTYPES["BF16"], base).payload
    finally:
        native.kernels = kernels
    assert len(set(payloads.values())) == 1, {k: len(v) for k, v in payloads.items()}


def test_decode_checks_recorded_size_and_base():
    raw = bytes(range(256)) * 4
    enc = codec.encode(raw, BYTES)
    with pytest.raises(CorruptObject):
        codec.decode(enc.payload, len(raw) + 1)
    delta = codec.encode(raw, BYTES, bytes(len(raw)), method=Method.XOR)
    with pytest.raises(CorruptObject, match="base"):
        codec.decode(delta.payload, len(raw), None)


@pytest.mark.parametrize("base_len", [0, 10, 999, 1000, 1001, 5000])
def test_base_of_another_size_is_fitted(base_len):
    """A grown or shrunk tensor's last chunk deltas against its old self, cut or padded."""
    g = torch.Generator().manual_seed(base_len)
    raw = torch.randint(0, 256, (2000,), dtype=torch.uint8, generator=g).numpy().tobytes()
    base = (raw * 3)[:base_len * 2]
    for method in (Method.XOR, Method.ULP, Method.ULP_EXP, Method.SPARSE):
        enc = codec.encode(raw, DTYPES["BF16"], base, method=method)
        assert codec.decode(enc.payload, len(raw), base) == raw
    grown = codec.encode(raw, DTYPES["BF16"], raw[:1500])
    assert len(grown.payload) < len(codec.encode(raw, DTYPES["BF16"]).payload)


def test_decompression_bomb_is_refused():
    """A zstd plane that expands past the recorded size is rejected, not allocated."""
    import zstandard

    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(50_000_000))
    payload = struct.pack("<BBBBQI", 1, int(Method.RAW), 1, 0, 1000, 1) + struct.pack("<BQQ", 1, 1000, len(bomb)) + bomb
    with pytest.raises(CorruptObject, match="wrong length"):
        codec.decode(payload, 1000)


@settings(max_examples=200, deadline=None)
@given(hs.binary(max_size=200))
def test_fuzz_payloads_fail_cleanly(payload):
    try:
        codec.decode(payload, 64, bytes(64))
    except CorruptObject:
        pass


def test_peek_rejects_trailing_garbage():
    enc = codec.encode(b"x" * 100, BYTES)
    peek(enc.payload)
    with pytest.raises(CorruptObject):
        peek(enc.payload + b"!")


def related_pair(nbytes: int, changed: float, seed: int) -> tuple[bytes, bytes]:
    """(raw, base): random bytes, and a copy with about ``changed`` of its bytes replaced."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    base = raw.clone()
    flip = torch.rand(nbytes, generator=g) < changed
    base[flip] = torch.randint(0, 256, (int(flip.sum()),), dtype=torch.uint8, generator=g)
    return raw.numpy().tobytes(), base.numpy().tobytes()


@pytest.mark.parametrize("name", ["BF16", "F32", "I8", "U8", "F8_E4M3", "BOOL", "I64"])
def test_numpy_and_torch_backends_write_identical_payloads(name):
    """The GPU path (torch) and the CPU path (numpy) are the same codec, byte for byte."""
    dtype = DTYPES[name]
    raw, base = related_pair(70_000 * dtype.width, 0.1, seed=1)
    for method in methods_for(dtype):
        b = base if method.uses_base else None
        on_cpu = codec.encode(raw, dtype, b, method=method)
        on_torch = codec.encode(raw, dtype, b, method=method, device="torch-cpu")
        assert on_cpu.payload == on_torch.payload, method
        assert codec.decode(on_cpu.payload, len(raw), b, device="torch-cpu") == raw


@settings(max_examples=80, deadline=None)
@given(dtype_name=hs.sampled_from(sorted(DTYPES)), data=hs.data())
def test_native_kernels_write_the_numpy_payloads(dtype_name, data):
    """The C kernels (wvc/codec/_native.c) and the numpy path are the same codec, byte for byte,
    both ways: each decodes what the other wrote."""
    if native.kernels is None:
        pytest.skip("C kernels not built")
    dtype = DTYPES[dtype_name]
    n = data.draw(hs.integers(0, 40_000))
    raw, base = related_pair(n * dtype.width, data.draw(hs.sampled_from([0.001, 0.01, 0.3, 1.0])),
                             seed=data.draw(hs.integers(0, 2**32 - 1)))
    kernels = native.kernels
    for method in methods_for(dtype):
        b = base if method.uses_base else None
        on_native = codec.encode(raw, dtype, b, method=method)
        native.kernels = None
        try:
            on_numpy = codec.encode(raw, dtype, b, method=method)
            assert codec.decode(on_native.payload, len(raw), b) == raw
        finally:
            native.kernels = kernels
        assert on_native.payload == on_numpy.payload, method
        assert codec.decode(on_numpy.payload, len(raw), b) == raw


@pytest.mark.parametrize("name", ["BF16", "F32", "I8", "I64"])
def test_sparse_gaps_past_every_escape_width_agree_on_both_paths(name):
    """Gaps of 0, 254, 255 (the first escaped), 256, 70_000 and 200_000 elements (escapes
    needing three bytes): the C and numpy SPARSE paths write and read the same payload."""
    if native.kernels is None:
        pytest.skip("C kernels not built")
    dtype = DTYPES[name]
    n = 300_000
    base = bytearray(torch.randint(0, 256, (n * dtype.width,), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(3)).numpy().tobytes())
    raw = bytearray(base)
    position = -1
    for gap in (0, 0, 254, 255, 256, 70_000, 200_000):
        position += gap + 1
        raw[position * dtype.width] ^= 0x5A
    raw, base = bytes(raw), bytes(base)
    on_native = codec.encode(raw, dtype, base, method=Method.SPARSE)
    kernels, native.kernels = native.kernels, None
    try:
        on_numpy = codec.encode(raw, dtype, base, method=Method.SPARSE)
        assert codec.decode(on_native.payload, len(raw), base) == raw
    finally:
        native.kernels = kernels
    assert on_native.payload == on_numpy.payload
    assert codec.decode(on_numpy.payload, len(raw), base) == raw


def _changes(raw: bytes, base: bytes, width: int) -> tuple[bytes, bytes, bytes]:
    """Where ``raw`` differs from ``base``, compared here element by element: (int32
    positions, the base's elements there, raw's)."""
    import numpy as np

    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    a, b = np.frombuffer(raw, dtype=kind), np.frombuffer(base, dtype=kind)
    where = np.flatnonzero(a != b)
    return where.astype(np.int32).tobytes(), b[where].tobytes(), a[where].tobytes()


@settings(max_examples=80, deadline=None)
@given(dtype_name=hs.sampled_from(sorted(DTYPES)), data=hs.data())
def test_a_sparse_payload_decodes_with_exactly_the_elements_it_changes(dtype_name, data):
    """decode_sparse_changes (a follower's decode of a SPARSE step, issue 65): the chunk
    decode gives, and the positions, old and new elements of exactly the elements that differ
    from the base, read off the payload's list (its inner delta: the dtype's)."""
    if native.kernels is None:
        pytest.skip("C kernels not built")
    dtype = DTYPES[dtype_name]
    n = data.draw(hs.integers(0, 400))
    base = data.draw(hs.binary(min_size=n * dtype.width, max_size=n * dtype.width))
    raw = bytearray(base)
    for i in data.draw(hs.lists(hs.integers(0, max(0, n - 1)), max_size=n // 4 + 1)) if n else []:
        raw[i * dtype.width] ^= data.draw(hs.integers(1, 255))
    raw = bytes(raw)
    payload = codec.encode(raw, dtype, base, method=Method.SPARSE).payload
    assert peek(payload).method is Method.SPARSE
    assert codec.decode_sparse_changes(payload, len(raw), base, dtype.width) == (raw, *_changes(raw, base, dtype.width))


def test_sparse_changes_skip_a_listed_zero_delta_and_refuse_what_is_not_theirs():
    """A payload that lists an element whose delta is zero (no encoder writes one; a remote's
    may) decodes to the same chunk, and that element is not called a change; a payload of
    another method or element width, or a base of another size, is not decoded this way
    (None); a damaged list is an error."""
    if native.kernels is None:
        pytest.skip("C kernels not built")
    import numpy as np

    from wvc.codec.container import compress_stream, stream_bytes

    dtype = DTYPES["BF16"]
    base = torch.randn(4096, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    raw = base.clone()
    raw[[3, 700, 4000]] += 1
    b, x = base.view(torch.int16).numpy().tobytes(), raw.view(torch.int16).numpy().tobytes()
    payload = codec.encode(x, dtype, b, method=Method.SPARSE).payload
    info = peek(payload)
    streams = [stream_bytes(payload, info, k) for k in range(len(info.streams))]
    # the list 3, 5, 700, 4000 with a zero delta at 5: gaps 3, 1, 694 and 3299 (both escaped)
    small = bytes([3, 1, 255, 255])
    big = np.array([694 - 255, 3299 - 255], dtype="<u4").view(np.uint8)
    values = [np.frombuffer(v, dtype=np.uint8) for v in streams[5:]]
    listed = [np.insert(v, 1, 0).tobytes() for v in values]  # (the inserted delta: zero)
    hostile = pack(Method.SPARSE, 2, info.param, len(x),
                   [compress_stream(s, 1) for s in [small] + [big[k::4].tobytes() for k in range(4)] + listed])
    assert codec.decode(hostile, len(x), b) == x
    assert codec.decode_sparse_changes(hostile, len(x), b, 2) == (x, *_changes(x, b, 2))
    other = codec.encode(x, dtype, b, method=Method.XOR).payload
    assert codec.decode_sparse_changes(other, len(x), b, 2) is None
    assert codec.decode_sparse_changes(payload, len(x), b[:-2], 2) is None
    # a payload of bytes over a bf16 tensor decodes to its chunk (its id checks that), but its
    # positions count bytes, not the tensor's elements: not decoded this way
    as_bytes = codec.encode(x, DTYPES["U8"], b, method=Method.SPARSE).payload
    assert peek(as_bytes).method is Method.SPARSE and peek(as_bytes).width == 1
    assert codec.decode_sparse_changes(as_bytes, len(x), b, 2) is None
    past = pack(Method.SPARSE, 2, info.param, len(x),
                [compress_stream(s, 1) for s in [bytes([255])] + [np.array([5000], "<u4").view(np.uint8)[k:k + 1]
                                                                  .tobytes() for k in range(4)]
                 + [bytes([1]), bytes([0])]])
    with pytest.raises(CorruptObject):
        codec.decode_sparse_changes(past, len(x), b, 2)


def test_c_kernels_are_built_where_required():
    """CI sets WVC_REQUIRE_NATIVE=1: the suite must exercise the C kernels, not silently fall back."""
    import os

    if not os.environ.get("WVC_REQUIRE_NATIVE"):
        pytest.skip("WVC_REQUIRE_NATIVE not set")
    assert native.kernels is not None, "wvc/codec/_native.c was not built (is a C compiler installed?)"


NO_NUMPY_PROBE = """
import sys
from wvc import Repo
repo = Repo.open(sys.argv[1])  # (init uses sqlite-utils, which imports numpy when present)
for source in sys.argv[2:]:
    repo.commit("step", source=source)
for back in range(len(sys.argv) - 2):
    repo.checkout(f"HEAD~{back}", output=f"{sys.argv[1]}-out{back}", force=True)
print("methods:", sorted(m for (m,) in repo.internals.db.conn.execute("SELECT DISTINCT method FROM objects")))
print("numpy imported:", "numpy" in sys.modules)
"""


def test_commit_and_checkout_on_the_c_kernels_do_not_load_numpy(tmp_path):
    """The C path works on the raw buffers: importing numpy cost a small model's commit ~15%."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import save_file

    if native.kernels is None:
        pytest.skip("the numpy path is in use")
    g = torch.Generator().manual_seed(0)
    w = {"w": torch.randn(256, 700, generator=g), "b": torch.randn(700, generator=g)}
    versions = [{k: v.to(torch.bfloat16) for k, v in w.items()}]

    def rl_step(sd):  # 1% of the elements move
        return {k: torch.where(torch.rand(v.shape, generator=g) < 0.01, v * 1.5, v) for k, v in sd.items()}

    versions.append(rl_step(versions[-1]))  # against a keyframe, no step before it: SPARSE
    versions.append({k: (v.float() + 1e-3 * torch.randn(v.shape, generator=g)).to(torch.bfloat16)
                     for k, v in versions[-1].items()})  # dense: ULP_EXP (too many changes for a step coder)
    versions.append(rl_step(versions[-1]))  # with the step before at hand: a step coder
    sources = []
    for step, sd in enumerate(versions):
        d = tmp_path / f"step{step}"
        d.mkdir()
        save_file(sd, str(d / "model.safetensors"))
        sources.append(str(d))
    from wvc import Repo

    Repo.init(tmp_path / "repo").close()
    r = subprocess.run([sys.executable, "-c", NO_NUMPY_PROBE, str(tmp_path / "repo"), *sources],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    methods, imported = r.stdout.strip().splitlines()[-2:]
    assert imported == "numpy imported: False"
    assert all(f"{int(m)}" in methods for m in (Method.PLANES, Method.ULP_EXP, Method.SPARSE)), methods
    assert f"{int(Method.STEP_RUNS)}" in methods or f"{int(Method.STEP_BLOCKS)}" in methods, methods  # (step.prefers_runs)
    for back, source in enumerate(reversed(sources)):
        out = (tmp_path / f"repo-out{back}" / "model.safetensors").read_bytes()
        assert out == (Path(source) / "model.safetensors").read_bytes()


def _valid_payloads():
    out = []
    for seed, name in enumerate(("BF16", "F32", "I8", "F8_E4M3")):
        dtype = DTYPES[name]
        raw, base = related_pair(5000 * dtype.width, 0.05, seed=7 + seed)
        for method in methods_for(dtype):
            b = base if method.uses_base else None
            out.append((codec.encode(raw, dtype, b, method=method).payload, len(raw), b))
    return out


VALID_PAYLOADS = _valid_payloads()


@settings(max_examples=300, deadline=None)
@given(which=hs.integers(0, len(VALID_PAYLOADS) - 1), flips=hs.lists(hs.tuples(hs.integers(0, 10**9), hs.integers(1, 255)),
                                                                   min_size=1, max_size=4))
def test_damaged_payloads_fail_cleanly(which, flips):
    """Bit flips anywhere in a real payload (header, stream table, zstd frames, raw planes):
    decoding raises CorruptObject or returns exactly raw_size bytes; it never crashes, and
    the store's hash check catches the latter."""
    payload, raw_size, base = VALID_PAYLOADS[which]
    damaged = bytearray(payload)
    for pos, mask in flips:
        damaged[pos % len(damaged)] ^= mask
    try:
        out = codec.decode(bytes(damaged), raw_size, base)
    except CorruptObject:
        return
    assert len(out) == raw_size
