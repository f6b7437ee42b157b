"""Whole payloads in one C call (native.whole_payloads): the same bytes as the stream-by-stream
path, one call into the kernels per chunk, and every damaged payload refused."""

import os
import struct

import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as hs

from wvc import codec
from wvc.codec import container, native, transforms
from wvc.codec.container import Method, peek
from wvc.codec.transforms import applicable_methods
from wvc.errors import CorruptObject
from wvc.formats.dtypes import DTYPES

from .test_codec import related_pair

pytestmark = pytest.mark.skipif(not native.whole_payloads, reason="whole payloads unavailable (no C kernels or no "
                                "zstandard cffi library)")


def weights_pair(n: int, seed: int, dtype=torch.bfloat16, lr: float = 1e-4) -> tuple[bytes, bytes]:
    """(new, base): weights over many exponents and an optimizer-like step of them."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g, dtype=torch.float64) * torch.logspace(-5, 0, n, dtype=torch.float64)
    step = torch.randn(n, generator=g, dtype=torch.float64) * lr * (torch.rand(n, generator=g) < 0.7)
    return tuple(t.to(dtype).view(torch.uint8).numpy().tobytes() for t in (w + step, w))


def stream_by_stream(fn):
    native.whole_payloads = False
    try:
        return fn()
    finally:
        native.whole_payloads = True


@settings(max_examples=80, deadline=None)
@given(dtype_name=hs.sampled_from(sorted(DTYPES)), data=hs.data())
def test_whole_payloads_are_the_stream_by_stream_bytes(dtype_name, data):
    """Every method and dtype, random bit patterns: both paths write the same payload and each
    decodes the other's."""
    dtype = DTYPES[dtype_name]
    n = data.draw(hs.integers(0, 40_000))
    raw, base = related_pair(n * dtype.width, data.draw(hs.sampled_from([0.0, 0.001, 0.01, 0.3, 1.0])),
                             seed=data.draw(hs.integers(0, 2**32 - 1)))
    for method in applicable_methods(dtype, True):
        b = base if method.uses_base else None
        whole = codec.encode(raw, dtype, b, method=method).payload
        assert whole == stream_by_stream(lambda: codec.encode(raw, dtype, b, method=method).payload), method
        assert codec.decode(whole, len(raw), b) == raw
        assert stream_by_stream(lambda: codec.decode(whole, len(raw), b)) == raw


@pytest.mark.parametrize("torch_dtype,name", [(torch.bfloat16, "BF16"), (torch.float32, "F32"),
                                              (torch.float16, "F16"), (torch.float8_e4m3fn, "F8_E4M3")])
@pytest.mark.parametrize("level", [1, 3])
def test_grouped_deltas_and_keyframes_of_weights_are_the_same_bytes(torch_dtype, name, level):
    """Real-looking weights: many exponent groups, packed planes, stored noise planes, zstd
    planes; the method the encoder picks and its payload agree on both paths, at two zstd levels."""
    dtype = DTYPES[name]
    new, base = weights_pair(300_000, seed=7, dtype=torch_dtype)
    for b in (base, None):
        whole = codec.encode(new, dtype, b, level=level)
        split = stream_by_stream(lambda: codec.encode(new, dtype, b, level=level))
        assert (whole.method, whole.payload) == (split.method, split.payload)
        coders = {c for c, *_ in peek(whole.payload).streams}
        if b is not None and whole.method is Method.ULP_EXP:
            assert len(peek(whole.payload).streams) > dtype.width  # several groups
        assert codec.decode(whole.payload, len(new), b if whole.uses_base else None) == new
    assert coders  # the keyframe's streams were read


def test_one_kernel_call_encodes_a_chunk(monkeypatch):
    """The per-stream Python work is gone: encoding a chunk of 40 streams makes no
    compress_stream call and one encode_payload call per method it encodes with (each such
    call releases the GIL once; each stream cost two hand-offs of it before, 11,522 streams
    in 864 chunks on the benchmark's many-tensor model)."""
    calls = {"encode_payload": 0, "compress_stream": 0}
    real_kernels = native.kernels

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real_kernels, name)
            if name != "encode_payload":
                return fn

            def counted(*a):
                calls["encode_payload"] += 1
                return fn(*a)
            return counted

    real_compress = container.compress_stream
    monkeypatch.setattr(native, "kernels", Counting())
    monkeypatch.setattr(transforms, "compress_stream", lambda *a: calls.__setitem__(
        "compress_stream", calls["compress_stream"] + 1) or real_compress(*a))
    new, base = weights_pair(1 << 20, seed=3)  # 2 MiB: sampled selection, then the winner
    enc = codec.encode(new, DTYPES["BF16"], base)
    assert len(peek(enc.payload).streams) >= 20
    assert calls["compress_stream"] == 0
    # a trial on a sample per candidate method, then the winner's payload: never one per stream
    assert 1 <= calls["encode_payload"] <= len(transforms.candidate_methods(DTYPES["BF16"], True)) + 1


def test_damaged_payloads_are_refused_by_the_whole_decoder():
    """Truncations and bit flips anywhere in real payloads: CorruptObject or the exact bytes,
    never a crash or wrong bytes (a flip inside a stored stream changes the chunk, which the
    store's hash check catches; here it must at least decode to the right length)."""
    new, base = weights_pair(50_000, seed=11)
    dtype = DTYPES["BF16"]
    for method in (Method.ULP_EXP, Method.SPARSE, Method.PLANES, Method.XOR):
        b = base if method.uses_base else None
        payload = codec.encode(new, dtype, b, method=method).payload
        for cut in range(0, len(payload), max(1, len(payload) // 97)):
            with pytest.raises(CorruptObject):
                codec.decode(payload[:cut], len(new), b)
        g = torch.Generator().manual_seed(5)
        for pos in torch.randint(0, len(payload), (200,), generator=g).tolist():
            damaged = bytearray(payload)
            damaged[pos] ^= 1 << (pos % 8)
            try:
                out = codec.decode(bytes(damaged), len(new), b)
            except CorruptObject:
                continue
            assert len(out) == len(new)


def test_a_zstd_bomb_is_refused_without_allocating():
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(50_000_000))
    payload = (struct.pack("<BBBBQI", 1, int(Method.RAW), 1, 0, 1000, 1) + struct.pack("<BQQ", 1, 1000, len(bomb))
               + bomb)
    with pytest.raises(CorruptObject, match="wrong length"):
        codec.decode(payload, 1000)


def test_whole_payloads_are_used_where_the_c_kernels_are_required():
    """CI sets WVC_REQUIRE_NATIVE=1: the fast path must be the one the suite runs."""
    if not os.environ.get("WVC_REQUIRE_NATIVE"):
        pytest.skip("WVC_REQUIRE_NATIVE not set")
    assert native.whole_payloads


def test_without_zstandards_library_or_with_another_version_the_stream_path_is_kept(monkeypatch):
    """No cffi build of zstd beside zstandard (some distributions' packages), or one of another
    version than zstandard's own (its payloads could differ): whole payloads stay off, and
    the payloads are the same either way."""
    import zstandard

    assert native._zstd_functions(zstandard) is not None
    monkeypatch.setattr(native.os.path, "exists", lambda p: False)
    assert native._zstd_functions(zstandard) is None
    assert native._connect_zstd() is False
    monkeypatch.undo()
    monkeypatch.setattr(zstandard, "ZSTD_VERSION", (1, 4, 0))
    assert native._connect_zstd() is False
    monkeypatch.undo()
    assert native._connect_zstd() is True  # (use_zstd again: the same functions)
    monkeypatch.setenv("WVC_NO_WHOLE_PAYLOADS", "1")
    assert native._connect_zstd() is False


def test_the_c_decoder_alone_refuses_damaged_payloads_and_wrong_parameters():
    """decode_payload re-checks everything itself (a payload reaches it after peek, but it
    must not trust that): mutated real payloads with any transform, shift and base size give
    a chunk of the right size or ValueError, never a crash. (The same loop ran 1.1M
    mutations under AddressSanitizer and UBSan when this was written.) Whether the bytes are
    right is the store's hash check's job."""
    import random

    rng = random.Random(4)
    kernels = native.kernels
    cases = []
    for name in ("BF16", "F32", "I8", "F64", "F8_E5M2"):
        dtype = DTYPES[name]
        raw, base = related_pair(3000 * dtype.width, 0.05, seed=len(cases))
        for method in applicable_methods(dtype, True):
            b = base if method.uses_base else None
            cases.append((codec.encode(raw, dtype, b, method=method).payload, raw, base, dtype))
    for _ in range(3000):
        payload, raw, base, dtype = rng.choice(cases)
        damaged = bytearray(payload)
        for _ in range(rng.randrange(1, 4)):
            if damaged:
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        damaged = bytes(damaged[: rng.randrange(len(damaged) + 1)] if rng.random() < 0.2 else damaged)
        b = rng.choice([base, base[:-dtype.width], None])
        shift = rng.choice([-1, dtype.exponent[0] if dtype.exponent else -1, rng.randrange(0, 70)])
        try:
            out = kernels.decode_payload(damaged, b, dtype.width, rng.randrange(0, 6), shift, rng.randrange(2),
                                         rng.choice([1, 16384]))
        except ValueError:
            continue
        assert len(out) == struct.unpack_from("<Q", damaged, 4)[0]  # what the header declares, exactly


def test_threads_that_exit_leave_no_kernel_buffers_behind():
    """Each thread that codes keeps buffers of a few chunk sizes and two zstd contexts between
    chunks; they are freed when it exits (a pthread key's destructor), so a program decoding
    from many short-lived threads does not keep every dead thread's ~20 MiB."""
    import threading
    import time

    new, base = weights_pair(1 << 19, seed=2)
    payload = codec.encode(new, DTYPES["BF16"], base).payload
    before = native.kernels.live_thread_states()
    results = []

    def work():
        results.append(codec.decode(payload, len(new), base) == new and len(codec.encode(new, DTYPES["BF16"], base).payload))

    threads = [threading.Thread(target=work) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20 and all(results)
    # join() returns once the Python side is done; the thread's C-level exit (where the
    # destructor runs) follows at once: wait for that event, bounded
    deadline = time.monotonic() + 10
    while native.kernels.live_thread_states() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert native.kernels.live_thread_states() == before
