"""Chunk transforms: byte planes, XOR, ULP-distance and exponent-grouped deltas.

Every transform works on the integer view of the bytes, so it is lossless for any bit
pattern (NaN payloads, -0.0, subnormals) and any dtype; integer arithmetic wraps, and
wrapping subtraction is exactly invertible by wrapping addition. The code is written
once against :mod:`wvc.codec.backends` (numpy on the CPU, torch on a GPU).

ULP_EXP groups the ULP deltas by the *base* value's exponent before the plane split. An
optimizer step moves a weight by about the learning rate in value, which is many units in
the last place for a small weight and few for a large one: the exponent, which the
decoder knows from the base, predicts the delta's magnitude, and zstd codes each group
with its own statistics. The decoder rebuilds the grouping from the base, so it costs
nothing to transmit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CorruptObject
from ..formats.dtypes import DType, value_order
from . import native, step_coder
from .container import (ENTROPY_SAMPLE_STRIDE, INCOMPRESSIBLE_BITS, PACKED_BELOW, ROTATED, STEP_METHODS, Method,
                        compress_stream, pack, pack_step, peek, step_bits, stream_bytes, zstd_parameters)

# transform codes of _native.c
_NATIVE_CODE = {Method.RAW: 0, Method.PLANES: 0, Method.XOR: 1, Method.ULP: 2, Method.ULP_EXP: 2, Method.SUB: 3}
_NATIVE_ROTATE = 4  # PLANES with parameter ROTATED


def _native_code(method: Method, param: int) -> int:
    return _NATIVE_ROTATE if method is Method.PLANES and param == ROTATED else _NATIVE_CODE[method]

# Sampling: for big chunks, pick the method on slices and encode only the winner.
SAMPLE_BYTES = 256 * 1024
# Chunks from this size on pick their method on a quarter-size sample (at most SAMPLE_BYTES);
# smaller ones try every candidate in full.
MIN_SAMPLED = 128 * 1024
# Exponent groups smaller than this are merged with their neighbours (per-stream overhead).
MIN_GROUP = 16384


@dataclass(frozen=True)
class Encoded:
    payload: bytes
    method: Method

    @property
    def uses_base(self) -> bool:
        return self.method.uses_base


_ordered = value_order  # sign-magnitude float bits -> integers in value order (an involution)


def _zigzag(d, bits: int):
    return (d << 1) ^ (d >> (bits - 1))


def _unzigzag(z, bits: int):
    logical = (z >> 1) & ((1 << (bits - 1)) - 1)
    return logical ^ -(z & 1)


def _rotate_left(x, bits: int):
    """The sign bit to bit 0: a float's exponent then fills the top byte (bf16, fp32)."""
    return (x << 1) | ((x >> (bits - 1)) & 1)


def _rotate_right(y, bits: int):
    return ((y >> 1) & ((1 << (bits - 1)) - 1)) | ((y & 1) << (bits - 1))


def planes_param(dtype: DType) -> int:
    """PLANES rotates floats whose exponent sits below the sign (measured: bf16 keyframes
    0.8-1.1% smaller, fp32 0.3%: the sign bit, noise, leaves the exponent's byte)."""
    return ROTATED if dtype.kind == "float" and dtype.width > 1 and dtype.exponent else 0


def _transform(method: Method, x, b, bits: int):
    if method in (Method.RAW, Method.PLANES):
        return x
    if method is Method.XOR:
        return x ^ b
    if method in (Method.ULP, Method.ULP_EXP):
        return _zigzag(_ordered(x, bits) - _ordered(b, bits), bits)
    if method is Method.SUB:
        return _zigzag(x - b, bits)
    raise AssertionError(method)


def _inverse(method: Method, y, b, bits: int):
    if method in (Method.RAW, Method.PLANES):
        return y
    if method is Method.XOR:
        return y ^ b
    if method in (Method.ULP, Method.ULP_EXP):
        return _ordered(_unzigzag(y, bits) + _ordered(b, bits), bits)
    if method is Method.SUB:
        return _unzigzag(y, bits) + b
    raise AssertionError(method)


def exponent_groups(xp, b, shift: int, bits: int) -> tuple[object, list[int]]:
    """(permutation sorting elements by the base's exponent, sizes of the merged groups)."""
    mask = (1 << (bits - 1 - shift)) - 1
    key = xp.exponent_key(b, shift, mask)
    perm = xp.argsort_stable(key)
    return perm, merge_groups(xp.bincount(key, mask + 1))


def merge_groups(counts) -> list[int]:
    """Elements per key, in key order -> group sizes, small neighbours merged."""
    sizes, run = [], 0
    for count in counts:
        run += count
        if run >= MIN_GROUP:
            sizes.append(run)
            run = 0
    if run:
        if sizes:
            sizes[-1] += run
        else:
            sizes.append(run)
    return sizes


def inner_method(dtype: DType) -> Method:
    """The element-wise delta a SPARSE payload stores the nonzero values of."""
    return {"float": Method.ULP, "int": Method.SUB}.get(dtype.kind, Method.XOR)


def applicable_methods(dtype: DType, has_base: bool, has_context: bool = False) -> list[Method]:
    """Every method that can encode this dtype (each decodes whatever the encoder picked)."""
    full = Method.PLANES if dtype.width > 1 else Method.RAW
    if not has_base:
        return [full]
    if dtype.kind == "float":
        grouped = [Method.ULP_EXP] if dtype.exponent else []
        stepped = list(STEP_METHODS) if has_context and step_applies(dtype) else []
        return [full, Method.XOR, Method.ULP, *grouped, Method.SPARSE, *stepped]
    if dtype.kind == "int":
        return [full, Method.XOR, Method.SUB, Method.SPARSE]
    return [full, Method.XOR, Method.SPARSE]


def step_applies(dtype: DType) -> bool:
    """The step coders (ULP_STEP, STEP_BLOCKS) code floats of 1, 2 or 4 bytes with an exponent
    field (bf16, fp16, fp32, fp8)."""
    return dtype.kind == "float" and bool(dtype.exponent) and step_coder.supports(dtype.width, dtype.exponent[0])


# A step coder is tried only when at most this share of the chunk's elements changed: its
# decode costs ~30 ns a changed one (a few adaptive binary decisions each), where SPARSE's
# costs ~3 ns. (Measured for ULP_STEP, which also paid ~2 ns an element to find each one's
# context: the real bf16 run at lr 1e-5 changes 0.4-8.6% of a chunk; the benchmark's
# Adam-like chain 20%, where ULP_STEP stored 7-11% less but the deepest checkout took 9-15x
# the first's instead of 4.3x. STEP_BLOCKS, which the encoder writes now, pays ~0.25 ns an
# element instead; the bound is kept, so the choice between methods is the same.)
STEP_MAX_CHANGED = 0.10
# ... unless so few changed that its decode costs nothing to speak of (~50 us at most): a
# small tensor's step (a LayerNorm's, a bias's) often changes more of its elements.
STEP_FEW_CHANGES = 1024
# Nor when more than this many times as many elements moved from the context to the base as
# from the base to the chunk: the context is then a span's drift (an anchor's, docs/codec.md),
# which predicts a step poorly, and the decoder still spends a decision or two on each element
# that moved in it. On the real bf16 run's steps the two counts are within 0.66-1.07x of
# each other; a step over an anchor of 4 steps measured 3.9x, where its payload decoded in
# 2.7x a keyframe's time against SPARSE's 0.23x for 1.5x the bytes.
STEP_STALE_CONTEXT = 2


def candidate_methods(dtype: DType, has_base: bool) -> list[Method]:
    """The methods the encoder tries. For floats with an exponent field, XOR and plain ULP
    are left out: on every benchmark case the exponent-grouped ULP delta is at least as
    small (measured: the largest loss 0.02%, on one case), and trying them cost 10-17% of
    the encode time."""
    full = Method.PLANES if dtype.width > 1 else Method.RAW
    if not has_base:
        return [full]
    if dtype.kind == "float":
        if dtype.exponent:
            return [full, Method.ULP_EXP, Method.SPARSE]
        return [full, Method.XOR, Method.ULP, Method.SPARSE]
    if dtype.kind == "int":
        return [full, Method.XOR, Method.SUB, Method.SPARSE]
    return [full, Method.XOR, Method.SPARSE]


def _encode_with(xp, method: Method, x, b, dtype: DType, level: int) -> bytes:
    """The payload of ``method`` on backend arrays (numpy, or torch on a device)."""
    width, bits = dtype.width, dtype.width * 8
    if method is Method.SPARSE:
        # Few changed elements (RL steps, partial updates): store where and by how much.
        inner = inner_method(dtype)
        gaps, values = xp.nonzero_gaps(_transform(inner, x, b, bits))
        streams = [compress_stream(p, level) for p in _gap_streams(gaps)]
        streams += [compress_stream(p, level) for p in xp.planes(values, width)]
        return pack(method, width, int(inner), len(x) * width, streams)
    y = _transform(method, x, b, bits)
    param = 0
    if method is Method.PLANES and planes_param(dtype) == ROTATED:
        param, y = ROTATED, _rotate_left(x, bits)
    if method is Method.ULP_EXP:
        param = dtype.exponent[0]
        perm, sizes = exponent_groups(xp, b, param, bits)
        y = y[perm]
    else:
        sizes = [len(x)]
    streams, start = [], 0
    for n in sizes:
        streams += [compress_stream(p, level) for p in xp.planes(y[start : start + n], width)]
        start += n
    return pack(method, width, param, len(x) * width, streams)


def _encode_native(method: Method, x, b, dtype: DType, level: int) -> bytes:
    """The same payload as :func:`_encode_with`, from the C kernels on raw byte buffers
    (``x``, ``b``: memoryviews; no numpy): transform, group and plane split in one C pass."""
    width, n = dtype.width, len(x) // dtype.width
    if native.whole_payloads:
        return _encode_whole(method, x, b, dtype, level)
    if method is Method.SPARSE:
        inner = inner_method(dtype)
        small, big, values = native.kernels.sparse_encode(x, b, width, _NATIVE_CODE[inner], -1)
        nz, nb = len(small), len(big) // 4
        parts = [memoryview(small)] + [memoryview(big)[k * nb : (k + 1) * nb] for k in range(4)]
        parts += [memoryview(values)[j * nz : (j + 1) * nz] for j in range(width)]
        return pack(method, width, int(inner), n * width, [compress_stream(p, level) for p in parts])
    shift = dtype.exponent[0] if method is Method.ULP_EXP else -1
    param = planes_param(dtype) if method is Method.PLANES else max(shift, 0)
    planes, counts = native.kernels.encode_planes(x, b if method.uses_base else None, width, _native_code(method, param), shift)
    sizes = merge_groups(counts) if counts is not None else [n]
    view, streams, start = memoryview(planes), [], 0
    for size in sizes:
        streams += [compress_stream(view[j * n + start : j * n + start + size], level) for j in range(width)]
        start += size
    return pack(method, width, param, n * width, streams)


def _encode_whole(method: Method, x, b, dtype: DType, level: int) -> bytes:
    """:func:`_encode_native`'s payload from one C call (native.whole_payloads)."""
    sparse = method is Method.SPARSE
    if sparse:
        inner = inner_method(dtype)
        code, shift, param = _NATIVE_CODE[inner], -1, int(inner)
    else:
        shift = dtype.exponent[0] if method is Method.ULP_EXP else -1
        param = planes_param(dtype) if method is Method.PLANES else max(shift, 0)
        code = _native_code(method, param)
    return native.kernels.encode_payload(
        x, b if method.uses_base else None, dtype.width, code, shift, int(method), param, sparse, MIN_GROUP,
        zstd_parameters(level), ENTROPY_SAMPLE_STRIDE, PACKED_BELOW, INCOMPRESSIBLE_BITS)


def _decode_whole(payload, info, b) -> bytes:
    """:func:`_decode_native` and :func:`_decode_sparse_native` in one C call."""
    sparse = info.method is Method.SPARSE
    if sparse:
        code, shift = _NATIVE_CODE[Method(info.param)], -1
    else:
        code = _native_code(info.method, info.param)
        shift = info.param if info.method is Method.ULP_EXP else -1
    try:
        return native.kernels.decode_payload(payload, b, info.width, code, shift, sparse, MIN_GROUP)
    except ValueError as exc:  # every length is checked on the C side
        raise CorruptObject(str(exc)) from exc


def _decode_native(payload, info, b) -> bytes:
    width = info.width
    n = info.raw_size // width
    groups = len(info.streams) // width
    if len(info.streams) % width or groups < 1:
        raise CorruptObject("stream count does not match the element width")
    streams, lengths = [], []
    for k in range(len(info.streams)):
        data = stream_bytes(payload, info, k)
        if k % width == 0:
            lengths.append(len(data))
        elif len(data) != lengths[-1]:
            raise CorruptObject("stream lengths do not match the chunk's groups")
        streams.append(data)
    if sum(lengths) != n:
        raise CorruptObject("stream lengths do not add up to the chunk")
    shift = info.param if info.method is Method.ULP_EXP else -1
    try:  # joins the planes straight from the decompressed streams
        raw, counts = native.kernels.decode_planes(streams, b, width, _native_code(info.method, info.param), shift)
    except ValueError as exc:  # a parameter no encoder writes
        raise CorruptObject(f"payload parameters are invalid: {exc}") from exc
    if (merge_groups(counts) if counts is not None else [n]) != lengths:
        raise CorruptObject("stream count does not match the chunk's groups")
    return raw


# The step coder the encoder writes; None: STEP_RUNS or STEP_BLOCKS, as step_coder.prefers_runs says
# (docs/codec.md has the figures; ULP_STEP is still read; benchmarks/step_decode.py and long_run
# --step-coder set one to compare them).
STEP_CODER: Method | None = None
# each step coder's functions in codec/step_coder.py (encode, decode: the bits after the short header)
_STEP_CODERS = {Method.ULP_STEP: ("encode", "decode"), Method.STEP_BLOCKS: ("encode_blocks", "decode_blocks"),
                Method.STEP_RUNS: ("encode_runs", "decode_runs")}


def _encode_step(raw, base, context, dtype: DType, method: Method | None = None) -> Encoded:
    """A step coder's payload: ``method`` if given (a caller forcing one), else STEP_CODER's."""
    method = method or STEP_CODER or (Method.STEP_RUNS if step_coder.prefers_runs(raw, base, context, dtype.width)
                                      else Method.STEP_BLOCKS)
    shift = dtype.exponent[0]
    coder = getattr(step_coder, _STEP_CODERS[method][0])
    return Encoded(pack_step(dtype.width, shift, len(raw), coder(raw, base, context, dtype.width, shift), method),
                   method)


def encode_chunk(
    raw, dtype: DType, base=None, *, context=None, device: str = "cpu", level: int = 1, method: Method | None = None
) -> Encoded:
    """Smallest encoding of ``raw``; ``method`` forces one (tests use it to cover each).

    ``context`` (the base's own base) adds a step coder (STEP_BLOCKS) to the candidates, for
    floats it codes and when few enough elements changed (STEP_MAX_CHANGED); it must beat the
    other methods by a margin (STEP_MIN_GAIN), with the C coder only (the Python twin is slow)."""
    raw = memoryview(raw).cast("B")
    if len(raw) % dtype.width:
        raise ValueError("chunk is not a whole number of elements")
    if base is not None:
        base = memoryview(fit_base(base, len(raw))).cast("B")
    if context is not None:
        context = memoryview(fit_base(context, len(raw))).cast("B") if base is not None and step_applies(dtype) else None
    if method is not None and method.uses_context:
        if context is None:
            raise ValueError(f"{method.name} needs a base, a context and a float dtype it codes")
        return _encode_step(raw, base, context, dtype, method)
    if not (method is None and _tries_step(raw, dtype, base, context)):
        return _encode_others(raw, dtype, base, device, level, method)
    # the step coder in full (a sample trial of it cost more than it saved), then the others:
    # on big chunks their winner is encoded in full only when the step coder does not clearly
    # beat its estimate on the samples
    stepped = _encode_step(raw, base, context, dtype)
    best = _encode_others(raw, dtype, base, device, level, method, step_size=len(stepped.payload))
    return stepped if best is None or _step_wins(len(stepped.payload), len(best.payload), len(raw) // dtype.width) \
        else best


def tries_step(raw, dtype: DType, base, context) -> bool:
    """Whether :func:`encode_chunk` tries a step coder on this chunk (a device commit hands
    these chunks to the host: the range coder runs there)."""
    if base is None or context is None or not step_applies(dtype):
        return False
    raw = memoryview(raw).cast("B")
    return _tries_step(raw, dtype, memoryview(fit_base(base, len(raw))).cast("B"), context)


def _tries_step(raw, dtype: DType, base, context) -> bool:
    """(``base`` fitted, ``context`` None unless it applies: encode_chunk's arguments)"""
    if not (context is not None and step_coder.native() and len(raw)):
        return False
    if native.kernels is not None:
        def count(x, b):
            return native.kernels.changed_count(x, b, dtype.width)
    else:
        from .backends import backend

        xp = backend("cpu")

        def count(x, b):
            return xp.count_changed(xp.from_bytes(x, dtype.width), xp.from_bytes(b, dtype.width))
    changed = count(raw, base)
    if changed > max(STEP_MAX_CHANGED * (len(raw) // dtype.width), STEP_FEW_CHANGES):
        return False
    moved_before = count(base, context)
    return moved_before <= max(STEP_STALE_CONTEXT * changed, STEP_FEW_CHANGES)


def _step_wins(step_size: float, best_size: float, elements: int) -> bool:
    if step_size * 8 > STEP_DENSE_BITS * elements:
        return step_size <= STEP_MIN_GAIN_DENSE * best_size
    return step_size <= STEP_MIN_GAIN * best_size


# A step coder is kept only when at most this fraction of the other methods' best (on big chunks
# of its estimate on the samples, when its full encode is skipped): its decode costs more a
# changed element, so a marginal saving is not worth it.
STEP_MIN_GAIN = 0.8
# ... and at most this fraction when its payload holds more than STEP_DENSE_BITS bits an
# element. A step coder's decode costs ~14 ns a payload bit (its adaptive binary decisions)
# besides ~0.1 ns an element, where a keyframe's costs ~0.5 ns an element: past 0.2 bits an
# element a link costs over ~3 keyframe decodes (SPARSE's: 0.2-0.8). Over 200 calibrated
# synthetic steps this halved the decode of a chain (median 12.9 -> 6.8 keyframes, max 34.6 ->
# 13.5) for 2.6% more stored (docs/codec.md, "When a step coder is kept").
STEP_DENSE_BITS = 0.2
STEP_MIN_GAIN_DENSE = 0.5


def _operations(raw, base, dtype: DType, device: str):
    """(x, b, encode_with, sample, changed_in_sample) for the trials and the encode on
    ``device``; ``changed_in_sample(x, b, starts, per)``: how many of the sample's elements
    changed."""
    if device == "cpu" and native.kernels is not None:
        # the C kernels work on the raw buffers: this path never imports numpy
        def changed_in_sample(xs, bs, starts, per):
            # slice by slice: no joined copy of samples that a dense step never trials
            w = dtype.width
            return sum(native.kernels.changed_count(xs[s * w : (s + per) * w], bs[s * w : (s + per) * w], w)
                       for s in starts)

        return raw, base, _encode_native, _sample_bytes, changed_in_sample
    from .backends import backend

    xp = backend(device)
    x = xp.from_bytes(raw, dtype.width)
    b = xp.from_bytes(base, dtype.width) if base is not None else None

    def encode_with(m, x, b, dtype, level):
        return _encode_with(xp, m, x, b, dtype, level)

    def sample(arr, width, starts, per):
        return xp.sample(arr, starts, per)

    def changed_in_sample(xs, bs, starts, per):
        return xp.count_changed(xp.sample(xs, starts, per), xp.sample(bs, starts, per))

    return x, b, encode_with, sample, changed_in_sample


def _encode_others(raw, dtype: DType, base, device: str, level: int, method: Method | None,
                   step_size: int | None = None) -> Encoded | None:
    """The smallest encoding of the methods before the step coders; None when ``step_size`` (a
    step payload's) wins against the best's size estimated on the samples."""
    x, b, encode_with, sample, changed_in_sample = _operations(raw, base, dtype, device)
    methods = [method] if method is not None else candidate_methods(dtype, b is not None)
    if len(methods) > 1 and len(raw) >= MIN_SAMPLED:  # (chosen_method repeats this choice)
        sample_bytes = min(SAMPLE_BYTES, len(raw) // 4)
        # (not when a step payload competes: it is weighed against the sample's estimate,
        # and wins most often without the others encoded in full at all)
        choice = _best_on_sample(encode_with, sample, changed_in_sample, methods, x, b, dtype, level, len(raw),
                                 sample_bytes, full=None if step_size is not None else
                                 lambda m: encode_with(m, x, b, dtype, level))
        if step_size is not None and _step_wins(step_size, choice.estimate, len(raw) // dtype.width):
            return None
        if choice.payload is not None:
            return Encoded(choice.payload, choice.method)
        methods = [choice.method]
    best = None
    for m in methods:
        payload = encode_with(m, x, b, dtype, level)
        if best is None or len(payload) < len(best.payload):
            best = Encoded(payload, m)
    return best


def chosen_method(raw, dtype: DType, base, level: int = 1) -> Method | None:
    """The one method :func:`encode_chunk` (without a context) encodes ``raw`` with in full,
    chosen on the host exactly as it does; None for a chunk it tries several methods on in
    full (below MIN_SAMPLED). The batched device encoder (codec/batched.py) asks this and
    encodes the chosen method on the device: the same choice, so the same payload."""
    raw = memoryview(raw).cast("B")
    if base is not None:
        base = memoryview(fit_base(base, len(raw))).cast("B")
    methods = candidate_methods(dtype, base is not None)
    if len(methods) == 1:
        return methods[0]
    if len(raw) < MIN_SAMPLED:
        return None
    x, b, encode_with, sample, changed_in_sample = _operations(raw, base, dtype, "cpu")
    choice = _best_on_sample(encode_with, sample, changed_in_sample, methods, x, b, dtype, level, len(raw),
                             min(SAMPLE_BYTES, len(raw) // 4))
    if choice.single_delta and not choice.method.uses_base:
        # the host encodes the delta in full before it trusts the sample to reject it
        # (_best_on_sample's ``full``): this choice depends on that size, so it is the host's
        return None
    return choice.method


def _sample_bytes(buf, width: int, starts, per: int) -> bytes:
    """``per`` elements from each element index in ``starts``, joined (raw byte buffers)."""
    return b"".join(buf[s * width : (s + per) * width] for s in starts)


def fit_base(base, size: int):
    """The base cut or zero-padded to ``size`` bytes.

    When a tensor grows (new embedding rows) or shrinks, its last chunk changes size: the
    common prefix still deltas to nothing, and the decoder derives the same fitted base.
    """
    base = memoryview(base).cast("B")
    if len(base) == size:
        return base
    if len(base) > size:
        return base[:size]
    return bytes(base) + bytes(size - len(base))


# A delta at most this fraction of the raw sample is kept without trying the full encoding:
# full encodings of weights are 60-85% of raw, so it cannot win there (changes no payload of
# the benchmark; saves ~8% of a fine-tune's encode time).
DELTA_IS_CLEARLY_BEST = 1 / 4


# SPARSE is not tried on a sample in which more than this share of the elements changed.
# It stores each changed element's value ungrouped, plus its position: above 60% changed it
# was never the smallest on the benchmark (its largest winning share was 0.5, appended
# rows), and on a dense fine-tune its trial was the larger part of the trials' cost
# (a quarter of a MiniLM commit's encode time; the cut saves 9-12% of it). One chunk of the
# benchmark changed method (SPARSE had won on the sample, ULP_EXP is 0.04% smaller on the
# whole), no other payload.
SPARSE_MAX_CHANGED = 0.6


# With a single delta candidate left (a dense fine-tune, once SPARSE is cut), the trials only
# decide between it and the full encoding, which differ by far more than a sample this size
# can misjudge: the same four places, shorter. No payload of the benchmark changed; dense
# fp32 fine-tunes encode in 0.88-0.92x the time, bf16 0.97x.
ONE_DELTA_SAMPLE_BYTES = 32 * 1024


@dataclass(frozen=True)
class _Choice:
    method: Method
    estimate: float  # its payload's size, scaled from the sample (exact when ``payload`` is set)
    payload: bytes | None = None  # already encoded in full
    single_delta: bool = False  # one delta method was left to weigh against the full encoding


def _best_on_sample(encode_with, sample, changed_in_sample, methods, x, b, dtype, level, nbytes: int,
                    sample_bytes: int, full=None) -> _Choice:
    """Cheap model selection: encode a few spread slices with each method, keep the best,
    with its payload size scaled from the sample to the chunk.

    With one delta method left (a dense step, SPARSE cut) and ``full`` (encodes a method on
    the whole chunk), that delta is encoded in full first and kept without any trial when
    it is clearly best (DELTA_IS_CLEARLY_BEST): its trial on the sample decided nothing
    else, and cost a fifth of a many-tensor fine-tune's encode time."""
    n = nbytes // dtype.width
    per = max(1, sample_bytes // dtype.width // 4)
    starts = [0, n // 3, (2 * n) // 3, max(0, n - per)]
    if Method.SPARSE in methods and changed_in_sample(x, b, starts, per) > SPARSE_MAX_CHANGED * len(starts) * per:
        methods = [m for m in methods if m is not Method.SPARSE]
    deltas = [m for m in methods if m.uses_base]
    encoded = None
    if len(deltas) == 1 and full is not None:
        encoded = full(deltas[0])
        if len(encoded) <= nbytes * DELTA_IS_CLEARLY_BEST:
            return _Choice(deltas[0], len(encoded), encoded, True)
    if len(deltas) == 1 and per * dtype.width > ONE_DELTA_SAMPLE_BYTES // 4:
        per = ONE_DELTA_SAMPLE_BYTES // dtype.width // 4
    xs, bs = sample(x, dtype.width, starts, per), sample(b, dtype.width, starts, per)
    sample_len = len(starts) * per * dtype.width
    sizes = {m: len(encode_with(m, xs, bs, dtype, level)) for m in deltas}
    best = min(deltas, key=sizes.__getitem__) if deltas else None
    if best is None or sizes[best] > sample_len * DELTA_IS_CLEARLY_BEST:
        for m in methods:
            if m not in sizes:
                sizes[m] = len(encode_with(m, xs, bs, dtype, level))
    best = min(sizes, key=lambda m: (sizes[m], methods.index(m)))
    if encoded is not None and best is deltas[0]:
        return _Choice(best, len(encoded), encoded, True)
    return _Choice(best, sizes[best] * nbytes / sample_len, None, len(deltas) == 1)


def decode_chunk(payload, raw_size: int, base=None, *, context=None, device: str = "cpu") -> bytes:
    whole = device == "cpu" and native.kernels is not None and native.whole_payloads
    info = peek(payload, table=not whole)  # (the C decoder checks the stream table itself)
    if info.raw_size != raw_size:
        raise CorruptObject(f"payload holds {info.raw_size} bytes, expected {raw_size}")
    if raw_size == 0:
        return b""
    width, bits = info.width, info.width * 8
    base_raw = None
    if info.method.uses_base:
        if base is None:
            raise CorruptObject("delta payload without its base chunk")
        base_raw = fit_base(base, raw_size)
    if info.method.uses_context:  # the step coders: the same C or Python coder on every device
        context = context() if callable(context) else context
        if context is None:
            raise CorruptObject(f"{info.method.name} payload without the version before its base")
        coder = getattr(step_coder, _STEP_CODERS[info.method][1])
        return coder(step_bits(payload), base_raw, fit_base(context, raw_size), width, info.param)
    if whole:
        return _decode_whole(payload, info, base_raw)
    if device == "cpu" and native.kernels is not None:  # on the raw buffers, without numpy
        if info.method is Method.SPARSE:
            return _decode_sparse_native(payload, info, base_raw)
        return _decode_native(payload, info, base_raw)
    from .backends import backend

    xp = backend(device)
    b = xp.from_bytes(base_raw, width) if base_raw is not None else None
    if info.method is Method.SPARSE:
        return xp.to_bytes(_inverse(Method(info.param), _decode_sparse(xp, payload, info), b, bits))
    if info.method is Method.ULP_EXP:
        perm, sizes = exponent_groups(xp, b, info.param, bits)
    else:
        perm, sizes = None, [raw_size // width]
    if len(info.streams) != len(sizes) * width:
        raise CorruptObject("stream count does not match the chunk's groups")
    parts, k = [], 0
    for n in sizes:
        planes = [stream_bytes(payload, info, k + j) for j in range(width)]
        if any(len(p) != n for p in planes):
            raise CorruptObject("stream length does not match its group")
        parts.append(xp.unplanes(planes, width, n))
        k += width
    y = parts[0] if len(parts) == 1 else xp.concat(parts)
    if perm is not None:
        y = xp.scatter(y, perm)
    if info.method is Method.PLANES and info.param == ROTATED:
        return xp.to_bytes(_rotate_right(y, bits))
    return xp.to_bytes(_inverse(info.method, y, b, bits))


def decode_step_changes(payload, raw_size: int, base, positions, values,
                        width: int | None = None) -> tuple[bytes, ...] | None:
    """``decode(payload, raw_size, base, context=...)`` for a STEP_BLOCKS or STEP_RUNS payload
    whose context is given by where it differs from ``base`` (``positions``, int32 ascending,
    and its elements there), with the elements the chunk changes from ``base``: (chunk, their
    positions, their old elements, their new ones), codec/step_coder.py's decode_changes. None for
    a payload of another method, or of elements of other than ``width`` bytes where given (the
    caller decodes it the usual way: the positions would not count its tensor's elements)."""
    info = peek(payload, table=False)
    if info.method not in (Method.STEP_BLOCKS, Method.STEP_RUNS) or (width is not None and info.width != width):
        return None
    if info.raw_size != raw_size:
        raise CorruptObject(f"payload holds {info.raw_size} bytes, expected {raw_size}")
    if len(memoryview(base).cast("B")) != raw_size:
        return None  # (a base of another size: fitted, its changes are not positions in it)
    return step_coder.decode_changes(step_bits(payload), base, positions, values, info.width, info.param,
                               info.method is Method.STEP_RUNS)


def decode_on_keyframe(payload, keyframe, raw_size: int) -> bytes | None:
    """The chunk that ``payload`` decodes to over the chunk that ``keyframe`` decodes to, in
    one C call that never materialises that base, where the pair has the shape it takes
    (a bfloat16 or float32 ULP_EXP delta over a rotated PLANES keyframe of the same size: a
    fine-tune over the version it started from); None elsewhere (decode the keyframe, then
    the delta). Only the result's id checks it: a caller hashes it, as for any chain."""
    if not native.whole_payloads:
        return None
    info, key = peek(payload, table=False), peek(keyframe, table=False)  # (checked again in C)
    width = info.width
    if not (info.method is Method.ULP_EXP and key.method is Method.PLANES and key.param == ROTATED
            and width in (2, 4) and key.width == width and info.param == 8 * width - 9
            and info.raw_size == key.raw_size == raw_size > 0):
        return None
    try:
        return native.kernels.decode_on_keyframe(payload, keyframe, width, _NATIVE_CODE[Method.ULP_EXP], info.param,
                                                 MIN_GROUP)
    except ValueError as exc:  # every length is checked on the C side
        raise CorruptObject(str(exc)) from exc


GAP_ESCAPE = 255


def _gap_streams(gaps) -> list:
    """Gaps as one byte each; gaps >= 255 escape to four byte planes of (gap - 255)."""
    import numpy as np

    small = np.minimum(gaps, GAP_ESCAPE).astype(np.uint8)
    big = (gaps[gaps >= GAP_ESCAPE] - GAP_ESCAPE).astype(np.uint32).view(np.uint8)
    return [small] + [np.ascontiguousarray(big[k::4]) for k in range(4)]


def decode_sparse_changes(payload, raw_size: int, base, width: int) -> tuple[bytes, ...] | None:
    """``decode(payload, raw_size, base)`` for a SPARSE payload over a base of the chunk's size,
    with the elements the chunk changes from ``base``: (chunk, their int32 positions, their
    old elements, their new ones), read off the payload's own list of positions, so nothing
    compares the chunk with its base (a follower's step stored as SPARSE: a fifth of an RL
    step's chunks, whose comparison cost more than their decode). ``width``: the bytes of an
    element of the tensor the caller writes (the positions count its elements). None for a
    payload of another method or element width, a base of another size, or without the C
    kernels (decode it the usual way: its bytes are checked by their id, its positions not)."""
    import numpy as np

    if native.kernels is None:
        return None
    info = peek(payload)
    if info.method is not Method.SPARSE or info.width != width:
        return None
    if info.raw_size != raw_size:
        raise CorruptObject(f"payload holds {info.raw_size} bytes, expected {raw_size}")
    if len(memoryview(base).cast("B")) != raw_size:
        return None  # (a base of another size: fitted, its changes are not positions in it)
    streams = _sparse_streams(payload, info)
    chunk = _sparse_native(streams, base, info)  # (checks every length and position first)
    positions = np.cumsum(_sparse_gaps(np.frombuffer(streams[0], dtype=np.uint8), streams[1:5]) + 1) - 1
    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[info.width]
    old = np.frombuffer(base, dtype=kind)[positions]
    new = np.frombuffer(chunk, dtype=kind)[positions]
    moved = old != new  # (a listed zero delta changes nothing: its element is not a change)
    if not moved.all():
        positions, old, new = positions[moved], old[moved], new[moved]
    return chunk, positions.astype(np.int32).tobytes(), old.tobytes(), new.tobytes()


def _sparse_streams(payload, info) -> list:
    if len(info.streams) != 5 + info.width:  # before decompressing any (peek checked the inner method)
        raise CorruptObject("sparse payload has the wrong stream count")
    return [stream_bytes(payload, info, k) for k in range(len(info.streams))]


def _decode_sparse_native(payload, info, base) -> bytes:
    return _sparse_native(_sparse_streams(payload, info), base, info)


def _sparse_native(streams, base, info) -> bytes:
    try:
        return native.kernels.sparse_decode(streams, base, info.width, _NATIVE_CODE[Method(info.param)])
    except ValueError as exc:  # the C side checks every length and position
        raise CorruptObject(str(exc)) from exc


def _sparse_gaps(small, big_planes):
    """The gaps (int64) of a SPARSE payload's list: one byte each (``small``), escaped at
    GAP_ESCAPE to four byte planes of (gap - GAP_ESCAPE), one element per escape (the caller
    has checked their lengths)."""
    import numpy as np

    gaps = small.astype(np.int64)
    if len(big_planes[0]):
        big = np.empty(len(big_planes[0]) * 4, dtype=np.uint8)
        for k, plane in enumerate(big_planes):
            big[k::4] = np.frombuffer(plane, dtype=np.uint8)
        gaps[small == GAP_ESCAPE] += big.view("<u4").astype(np.int64)
    return gaps


def _decode_sparse(xp, payload, info):
    import numpy as np

    width, n = info.width, info.raw_size // info.width
    if len(info.streams) != 5 + width:
        raise CorruptObject("sparse payload has the wrong stream count")
    small = np.frombuffer(stream_bytes(payload, info, 0), dtype=np.uint8)
    count = len(small)
    escaped = small == GAP_ESCAPE
    big_planes = [stream_bytes(payload, info, 1 + k) for k in range(4)]
    if count > n or any(len(p) != int(escaped.sum()) for p in big_planes):
        raise CorruptObject("sparse payload positions are inconsistent")
    value_planes = [stream_bytes(payload, info, 5 + k) for k in range(width)]
    if any(len(p) != count for p in value_planes):
        raise CorruptObject("sparse payload values are inconsistent")
    gaps = _sparse_gaps(small, big_planes)
    values = xp.unplanes(value_planes, width, count)
    y = xp.from_gaps(gaps, values, n, width)
    if y is None:
        raise CorruptObject("sparse payload positions run past the chunk")
    return y
