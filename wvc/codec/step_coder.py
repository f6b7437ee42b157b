"""The step coders (ULP_STEP, STEP_BLOCKS, STEP_RUNS): a float chunk's ULP deltas coded in the
context of each element's previous step.

An optimizer step moves an element that moved at the step before again, mostly the same way
by a similar number of units in the last place (Adam's moments). The base ``b`` (step t-1)
and *its* base ``g`` (step t-2) are both known to the decoder, so the previous step's delta
``o(b) - o(g)`` is a context that costs nothing to transmit. docs/step-coders.md
has the format; ``_step.c`` is the fast implementation and this module its Python twin
(same bytes; used without the C build, and by the tests to check one against the other).

:func:`encode` / :func:`decode` (ULP_STEP), :func:`encode_blocks` / :func:`decode_blocks` and
:func:`encode_runs` / :func:`decode_runs` are the entry points, and :func:`prefers_runs` says
which of the last two a step is written with: they take the chunk, its base and the context
chunk as raw bytes of equal length, and choose C or Python.
"""

from __future__ import annotations

import functools

from .. import settings
from ..errors import CorruptObject
from ..formats.dtypes import value_order
from .container import STEP_WIDTHS, step_supports  # the format's bounds on ULP_STEP payloads

try:
    from . import _step as _c
except ImportError:
    _c = None
if settings.switch("WVC_NO_NATIVE"):  # (at import: which kernels load, settings.py)
    _c = None

CLASSES = 7
BUCKETS = 40
MAG_UNARY = 16
RATE_LIMIT = 255
INHERIT_N = 3  # a context starts from its class's last coded context, trusted like this many updates
RECIP = [(1 << 33) // (2 * n + 3) for n in range(RATE_LIMIT + 1)]
WIDTHS = STEP_WIDTHS
supports = step_supports  # whether the coder takes elements of a width with an exponent field at a shift


def native() -> bool:
    return _c is not None


def encode(x, b, g, width: int, shift: int) -> bytes:
    """ULP_STEP's bits of ``x`` against base ``b`` in the context ``g``."""
    return _c.encode(x, b, g, width, shift) if _c is not None else _encode_py(x, b, g, width, shift)


def decode(data, b, g, width: int, shift: int) -> bytes:
    return _decoded("decode", _decode_py, data, b, g, width, shift)


def _decoded(native_name: str, twin, data, b, g, width: int, shift: int) -> bytes:
    """The C decoder's result (its ValueError a CorruptObject), or the twin's without the build."""
    if _c is None:
        return twin(data, b, g, width, shift)
    try:
        return getattr(_c, native_name)(data, b, g, width, shift)
    except ValueError as exc:
        raise CorruptObject(str(exc)) from exc


# -- the Python twin -----------------------------------------------------------------------------
class _Bit:
    __slots__ = ("n", "p")

    def __init__(self):
        self.p, self.n = 0x80000000, 0

    def prob16(self) -> int:
        return min(max(self.p >> 16, 1), 65535)

    def adapt(self, bit: int) -> None:
        r = RECIP[self.n]
        if bit:
            self.p -= (self.p * r) >> 32
        else:
            self.p += ((0xFFFFFFFF - self.p) * r) >> 32
        if self.n < RATE_LIMIT:
            self.n += 1


class _Probabilities:
    """A context's probabilities (``bits()`` lists them all, in a fixed order)."""

    __slots__ = ()

    def inherited(self):
        """A copy for the next context of the same class, counts capped at INHERIT_N (_step.c)."""
        m = type(self)()
        for mine, theirs in zip(m.bits(), self.bits()):
            mine.p, mine.n = theirs.p, min(theirs.n, INHERIT_N)
        return m


class _Model(_Probabilities):
    def bits(self):
        yield self.any
        yield from self.run_bucket
        for t in self.run_top:
            yield from t
        yield self.sign
        yield from self.mag
        yield from self.mag_bucket
        for t in self.mag_top:
            yield from t

    def __init__(self):
        self.any = _Bit()
        self.run_bucket = [_Bit() for _ in range(BUCKETS + 1)]
        self.run_top = [[_Bit() for _ in range(3)] for _ in range(BUCKETS + 1)]
        self.sign = _Bit()
        self.mag = [_Bit() for _ in range(MAG_UNARY)]
        self.mag_bucket = [_Bit() for _ in range(BUCKETS + 1)]
        self.mag_top = [[_Bit() for _ in range(3)] for _ in range(BUCKETS + 1)]


class _Encoder:
    def __init__(self):
        self.low, self.range, self.cache, self.pending, self.started = 0, 0xFFFFFFFF, 0, 1, False
        self.out = bytearray()

    def _shift_low(self) -> None:
        if (self.low & 0xFFFFFFFF) < 0xFF000000 or self.low >> 32:
            carry, temp = self.low >> 32, self.cache
            while True:
                if self.started:
                    self.out.append((temp + carry) & 0xFF)
                self.started = True
                temp = 0xFF
                self.pending -= 1
                if not self.pending:
                    break
            self.cache = (self.low >> 24) & 0xFF
        self.pending += 1
        self.low = (self.low & 0x00FFFFFF) << 8

    def bit(self, m: _Bit, bit: int) -> None:
        bound = (self.range >> 16) * m.prob16()
        if bit:
            self.low += bound
            self.range -= bound
        else:
            self.range = bound
        m.adapt(bit)
        while self.range < 1 << 24:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self._shift_low()

    def direct(self, bit: int) -> None:
        self.range >>= 1
        if bit:
            self.low += self.range
        while self.range < 1 << 24:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self._shift_low()

    def golomb(self, bucket, top, v: int) -> None:
        j = v.bit_length() - 1
        for t in range(j):
            self.bit(bucket[t], 1)
        self.bit(bucket[j], 0)
        node = 0
        for t in range(j - 1, -1, -1):
            bit = (v >> t) & 1
            if t >= j - 2:
                self.bit(top[j][node], bit)
                node = 1 + bit
            else:
                self.direct(bit)

    def magnitude(self, unary, bucket, top, mag: int) -> None:
        """``mag - 1`` in unary up to MAG_UNARY, beyond it an exp-Golomb escape (both coders)."""
        u = mag - 1
        for t in range(min(u, MAG_UNARY)):
            self.bit(unary[t], 1)
        if u < MAG_UNARY:
            self.bit(unary[u], 0)
        else:
            self.golomb(bucket, top, u - MAG_UNARY + 1)

    def value(self, m: _Model, negative: int, mag: int) -> None:
        self.bit(m.sign, negative)
        self.magnitude(m.mag, m.mag_bucket, m.mag_top, mag)

    def log_magnitude(self, k: "_Key", bucket, top, mag: int) -> None:
        """STEP_RUNS's magnitude: its bucket in unary up to LOG_BUCKETS, then the bits below
        its leading one (the first two through a tree), beyond it an exp-Golomb escape."""
        j = mag.bit_length() - 1
        for t in range(min(j, LOG_BUCKETS)):
            self.bit(k.mag[t], 1)
        if j >= LOG_BUCKETS:
            self.golomb(bucket, top, mag - (1 << LOG_BUCKETS) + 1)
            return
        self.bit(k.mag[j], 0)
        node = 0
        for t in range(j - 1, -1, -1):
            bit = (mag >> t) & 1
            if t >= j - 2:
                self.bit(k.top[j - 1][node], bit)
                node = 1 + bit
            else:
                self.direct(bit)

    def finish(self) -> bytes:
        for m in range(32, -1, -1):  # the value with the most trailing zero bits (_step.c)
            v = (self.low + (1 << m) - 1) & ~((1 << m) - 1)
            if v < self.low + self.range:
                self.low = v
                break
        for _ in range(5):
            self._shift_low()
        return bytes(self.out).rstrip(b"\0")


class _Decoder:
    def __init__(self, data):
        self.data, self.at, self.range, self.code = bytes(data), 0, 0xFFFFFFFF, 0
        for _ in range(4):
            self.code = (self.code << 8) | self._next()

    def _next(self) -> int:
        if self.at < len(self.data):
            self.at += 1
            return self.data[self.at - 1]
        return 0

    def bit(self, m: _Bit) -> int:
        bound = (self.range >> 16) * m.prob16()
        if self.code < bound:
            self.range, bit = bound, 0
        else:
            self.code -= bound
            self.range -= bound
            bit = 1
        m.adapt(bit)
        while self.range < 1 << 24:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self.code = ((self.code << 8) | self._next()) & 0xFFFFFFFF
        return bit

    def direct(self) -> int:
        self.range >>= 1
        bit = int(self.code >= self.range)
        if bit:
            self.code -= self.range
        while self.range < 1 << 24:
            self.range = (self.range << 8) & 0xFFFFFFFF
            self.code = ((self.code << 8) | self._next()) & 0xFFFFFFFF
        return bit

    def golomb(self, bucket, top, max_bucket: int) -> int:
        j = 0
        while self.bit(bucket[j]):
            j += 1
            if j > max_bucket:
                raise CorruptObject("ULP_STEP payload: a run or delta is out of range")
        v, node = 1, 0
        for t in range(j - 1, -1, -1):
            if t >= j - 2:
                bit = self.bit(top[j][node])
                node = 1 + bit
            else:
                bit = self.direct()
            v = (v << 1) | bit
        return v

    def magnitude(self, unary, bucket, top, max_bucket: int) -> int:
        u = 0
        while u < MAG_UNARY and self.bit(unary[u]):
            u += 1
        if u == MAG_UNARY:
            u = MAG_UNARY + self.golomb(bucket, top, max_bucket) - 1
        return u + 1

    def log_magnitude(self, k: "_Key", bucket, top, max_bucket: int) -> int:
        j = 0
        while j < LOG_BUCKETS and self.bit(k.mag[j]):
            j += 1
        if j == LOG_BUCKETS:
            return self.golomb(bucket, top, max_bucket) + (1 << LOG_BUCKETS) - 1
        m, node = 1, 0
        for t in range(j - 1, -1, -1):
            if t >= j - 2:
                bit = self.bit(k.top[j - 1][node])
                node = 1 + bit
            else:
                bit = self.direct()
            m = (m << 1) | bit
        return m

    def value(self, m: _Model, max_bucket: int) -> tuple[int, int]:
        negative = self.bit(m.sign)
        return negative, self.magnitude(m.mag, m.mag_bucket, m.mag_top, max_bucket)


class _Steps:
    """Per element, the step before: ``p = o(b) - o(g)`` (wrapping), its class (0 | +1 | +2..3
    | >=+4 | -1 | -2..-3 | <=-4) and its size ``|p|``; both coders' layouts start here."""

    def __init__(self, b, g, width: int):
        import numpy as np

        self.utype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
        self.bits = bits = 8 * width
        self.mask, self.sign = mask, sign = (1 << bits) - 1, 1 << (bits - 1)
        self.bu = np.frombuffer(b, dtype=self.utype).astype(np.int64)
        self.gu = np.frombuffer(g, dtype=self.utype).astype(np.int64)
        self.ob = _ordered(self.bu, sign)
        p = (self.ob - _ordered(self.gu, sign)) & mask
        neg = (-p) & mask
        cls = np.select([p == 0, p == 1, (p & sign) == 0, neg == 1, neg <= 3], [0, 1, 2, 4, 5], 6)
        self.cls = np.where(((p & sign) == 0) & (p > 3), 3, cls)
        self.size = np.where((p & sign) == 0, p, neg)


class _Layout(_Steps):
    """What both sides derive from the base and the context: every element's context, the
    elements in context order, and where each context starts in that order."""

    def __init__(self, b, g, width: int, shift: int):
        import numpy as np

        super().__init__(b, g, width)
        bits, bu, cls = self.bits, self.bu, self.cls
        self.exp_bits = bits - 1 - shift
        nexp = 1 << self.exp_bits
        ctx = cls * nexp + ((bu >> shift) & (nexp - 1))
        self.order = np.argsort(ctx, kind="stable")
        self.starts = np.zeros(CLASSES * nexp + 1, dtype=np.int64)
        np.cumsum(np.bincount(ctx, minlength=CLASSES * nexp), out=self.starts[1:])

    def contexts(self):
        """(first position in context order, element count, model) of each nonempty context,
        in coding order; the model starts from the last one of its class (_step.c)."""
        last: dict[int, _Model] = {}
        for k in range(len(self.starts) - 1):
            seen = int(self.starts[k + 1] - self.starts[k])
            if seen:
                cls = k >> self.exp_bits
                last[cls] = last[cls].inherited() if cls in last else _Model()
                yield int(self.starts[k]), seen, last[cls]


def _ordered(v, sign: int):
    return value_order(v, sign.bit_length())


def _encode_py(x, b, g, width: int, shift: int) -> bytes:
    import numpy as np

    if not supports(width, shift) or not len(x) == len(b) == len(g) or len(x) % width:
        raise ValueError("ULP_STEP encode: sizes, width or shift do not fit")
    lay = _Layout(b, g, width, shift)
    mask, sign = lay.mask, lay.sign
    ox = _ordered(np.frombuffer(x, dtype=lay.utype).astype(np.int64), sign)
    delta = (ox - lay.ob) & mask
    enc = _Encoder()
    for start, seen, m in lay.contexts():
        d = delta[lay.order[start:start + seen]]
        changed = np.flatnonzero(d).tolist()
        enc.bit(m.any, int(bool(changed)))
        nxt = 0 if changed else seen
        for rank in changed:
            enc.golomb(m.run_bucket, m.run_top, rank - nxt + 1)
            v = int(d[rank])
            negative = int(v & sign != 0)
            enc.value(m, negative, ((-v) & mask) if negative else v)
            nxt = rank + 1
        if nxt < seen:
            enc.golomb(m.run_bucket, m.run_top, seen - nxt + 1)
    return enc.finish()


def _decode_py(data, b, g, width: int, shift: int) -> bytes:
    import numpy as np

    if not supports(width, shift) or len(b) != len(g) or len(b) % width:
        raise CorruptObject("ULP_STEP payload: sizes, width or shift do not fit")
    lay = _Layout(b, g, width, shift)
    mask, sign = lay.mask, lay.sign
    dec = _Decoder(data)
    where, deltas = [], []
    for start, seen, m in lay.contexts():
        nxt = 0 if dec.bit(m.any) else seen
        while nxt < seen:
            v = dec.golomb(m.run_bucket, m.run_top, 32)
            left = seen - nxt
            if v - 1 > left:
                raise CorruptObject("ULP_STEP payload: a run is longer than its context")
            if v - 1 == left:
                break
            rank = nxt + v - 1
            negative, mag = dec.value(m, lay.bits - 1)
            if mag > sign or (not negative and mag == sign):
                raise CorruptObject("ULP_STEP payload: a delta is out of range")
            where.append(start + rank)
            deltas.append(((-mag) & mask) if negative else mag)
            nxt = rank + 1
    if dec.at != len(dec.data):
        raise CorruptObject("ULP_STEP payload length does not match its contents")
    out = np.frombuffer(b, dtype=lay.utype).copy()
    if where:
        idx = lay.order[np.asarray(where, dtype=np.int64)]
        o = (lay.ob[idx] + np.asarray(deltas, dtype=np.int64)) & mask
        out[idx] = _ordered(o, sign).astype(lay.utype)
    return out.tobytes()


# -- STEP_BLOCKS: the same deltas in element order, by blocks of 64 (_step.c has the why) -----------
BLOCK = 64
SUB = 8  # a changed block's parts
INHERIT_SPAN = 4  # a context starts from the nearest started exponent of its class this close
LOG_BUCKETS = 6  # STEP_RUNS: magnitudes below 2^6 by their bucket, larger ones escape


def encode_blocks(x, b, g, width: int, shift: int) -> bytes:
    """STEP_BLOCKS's bits of ``x`` against base ``b`` in the context ``g``."""
    return _c.encode_blocks(x, b, g, width, shift) if _c is not None else _encode_blocks_py(x, b, g, width, shift)


def decode_blocks(data, b, g, width: int, shift: int) -> bytes:
    return _decoded("decode_blocks", _decode_blocks_py, data, b, g, width, shift)


# STEP_RUNS is written for a step where at most this share of the blocks with unmoved elements
# saw one of them change, else STEP_BLOCKS: on the real bf16 run's chunks runs are 1.6-4.7%
# smaller up to ~3% and 1-3.6% bigger from ~5.5% (their flags' exponent context pays there),
# and at few changed blocks they decode up to ~40% faster (docs/codec.md).
RUNS_MAX_CHANGED_BLOCKS = 0.04


def prefers_runs(x, b, g, width: int) -> bool:
    """Whether a step of ``x`` over ``b`` in the context ``g`` is written as STEP_RUNS."""
    if _c is not None:
        zs, changed = _c.z_blocks(x, b, g, width)
    else:
        zs, changed = _z_blocks_py(x, b, g, width)
    return changed <= RUNS_MAX_CHANGED_BLOCKS * zs


def _z_blocks_py(x, b, g, width: int) -> tuple[int, int]:
    import numpy as np

    t = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    xs, bs, gs = (np.frombuffer(v, dtype=t) for v in (x, b, g))
    pad = -len(bs) % BLOCK
    unmoved = np.concatenate([bs == gs, np.zeros(pad, bool)]).reshape(-1, BLOCK)
    changed = np.concatenate([xs != bs, np.zeros(pad, bool)]).reshape(-1, BLOCK) & unmoved
    return int(unmoved.any(1).sum()), int(changed.any(1).sum())


def encode_runs(x, b, g, width: int, shift: int) -> bytes:
    """STEP_RUNS's bits: STEP_BLOCKS's with runs of unchanged blocks in place of its block flags,
    and magnitudes by their bucket (docs/step-coders.md)."""
    return _c.encode_runs(x, b, g, width, shift) if _c is not None else _encode_blocks_py(x, b, g, width, shift, True)


def decode_runs(data, b, g, width: int, shift: int) -> bytes:
    return _decoded("decode_runs", functools.partial(_decode_blocks_py, runs=True), data, b, g, width, shift)


def decode_changes(data, b, positions, values, width: int, shift: int, runs: bool) -> tuple[bytes, ...]:
    """:func:`decode_blocks` (``runs``: :func:`decode_runs`) with the context given by where it
    differs from ``b``: ``positions`` (int32, strictly ascending) and its elements there
    (``values``). Returns the chunk, and of the elements where it differs from ``b`` their
    positions (int32, ascending), their elements in ``b`` and in the chunk. A follower keeps a step's context this way (~3% of the elements), and
    the positions are what it writes and keeps next: no comparison of the chunks, no whole
    context rebuilt (read/follower.py)."""
    if _c is None:
        return _decode_changes_py(data, b, positions, values, width, shift, runs)
    try:
        return _c.decode_changes(data, b, positions, values, width, shift, int(runs))
    except ValueError as exc:
        raise CorruptObject(str(exc)) from exc


def _decode_changes_py(data, b, positions, values, width: int, shift: int, runs: bool) -> tuple[bytes, ...]:
    import numpy as np

    t = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    base = np.frombuffer(b, dtype=t)
    where, there = np.frombuffer(positions, dtype=np.int32), np.frombuffer(values, dtype=t)
    if len(where) != len(there) or (len(where) and (where[0] < 0 or where[-1] >= len(base)
                                                    or bool((np.diff(where) <= 0).any()))):
        raise CorruptObject("step decode_changes: sizes, width, shift or context positions do not fit")
    g = base.copy()
    g[where] = there
    x = _decode_blocks_py(data, b, g.tobytes(), width, shift, runs=runs)
    new = np.frombuffer(x, dtype=t)
    changed = np.flatnonzero(new != base)
    return x, changed.astype(np.int32).tobytes(), base[changed].tobytes(), new[changed].tobytes()


class _Key(_Probabilities):
    """One (class, exponent) context's probabilities. Unmoved elements: changed (``flag``;
    ``after`` when the part's element before changed) and the sign. Moved ones: moved again
    as before (``flag``), else changed (``after``), then the same way (``again``). Both: the
    magnitude's unary part."""

    __slots__ = ("after", "again", "flag", "mag", "sign", "top")

    def __init__(self):
        self.flag, self.after, self.again, self.sign = _Bit(), _Bit(), _Bit(), _Bit()
        self.mag = [_Bit() for _ in range(MAG_UNARY)]  # STEP_RUNS: the first LOG_BUCKETS, its buckets
        self.top = [[_Bit() for _ in range(3)] for _ in range(LOG_BUCKETS - 1)]  # STEP_RUNS only

    def bits(self):
        yield self.flag
        yield self.after
        yield self.again
        yield self.sign
        yield from self.mag
        for t in self.top:
            yield from t



class _Blocks:
    def __init__(self, nexp: int):
        self.nexp = nexp
        self.keys: dict[tuple[int, int], _Key] = {}
        self.block = [_Bit() for _ in range(2 * nexp)]  # (smallest unmoved exponent, last block's flag)
        self.sub = [_Bit() for _ in range(2 * nexp)]  # a changed block's parts: the same
        # STEP_RUNS: a run's exp-Golomb code (whether it is empty: block[]), by whether the run
        # before was empty
        self.run = [([_Bit() for _ in range(BUCKETS + 1)], [[_Bit() for _ in range(3)] for _ in range(BUCKETS + 1)])
                    for _ in range(2)]
        self.escape = [([_Bit() for _ in range(BUCKETS + 1)], [[_Bit() for _ in range(3)] for _ in range(BUCKETS + 1)])
                       for _ in range(CLASSES)]

    def block_bit(self, exp, parts, hot: int) -> _Bit:
        """A block's "some unmoved element changed" (STEP_RUNS: "this run is empty"), by the
        smallest exponent of its unmoved elements and whether the last one coded 1."""
        return self.block[2 * min(exp[i] for z in parts for i in z) + hot]

    def key(self, cls: int, e: int) -> _Key:
        k = self.keys.get((cls, e))
        if k is None:
            near = ((cls, e + side * s) for s in range(1, INHERIT_SPAN + 1) for side in (-1, 1))
            start = next((self.keys[f] for f in near if f in self.keys), None)
            k = self.keys[(cls, e)] = start.inherited() if start is not None else _Key()
        return k


class _BlockLayout(_Steps):
    """Per element, what both sides derive from the base and the context, as lists (the
    coder walks them an element at a time)."""

    def __init__(self, b, g, width: int, shift: int):
        super().__init__(b, g, width)
        bu = self.bu
        self.n = len(bu)
        self.moved = (bu != self.gu).tolist()
        self.cls = self.cls.tolist()
        self.size = self.size.tolist()
        self.exp = ((bu >> shift) & ((1 << (self.bits - 1 - shift)) - 1)).tolist()

    def blocks(self) -> list:
        """(unmoved elements by part, moved elements) of each block; parts without unmoved
        elements left out."""
        out = []
        for i0 in range(0, self.n, BLOCK):
            parts, a = [], []
            for s0 in range(i0, min(self.n, i0 + BLOCK), SUB):
                z = []
                for i in range(s0, min(self.n, s0 + SUB)):
                    (a if self.moved[i] else z).append(i)
                if z:
                    parts.append(z)
            out.append((parts, a))
        return out


def _runs(blocks, changed) -> list[int | None]:
    """STEP_RUNS's runs, per block: the run coded at it (the blocks with unmoved elements
    from it on that pass before the next whose unmoved elements changed; all of them when
    none does), or None where none is coded. ``changed(parts)``: whether a block's did."""
    zs = [at for at, (parts, _) in enumerate(blocks) if parts]
    next_changed, at_or_after = [0] * len(zs), len(zs)  # (len(zs): none)
    for q in range(len(zs) - 1, -1, -1):
        if changed(blocks[zs[q]][0]):
            at_or_after = q
        next_changed[q] = at_or_after
    out: list[int | None] = [None] * len(blocks)
    q = 0
    while q < len(zs):  # a run at the first Z block and at the one after each that changed
        out[zs[q]] = next_changed[q] - q
        q = next_changed[q] + 1
    return out


def _encode_blocks_py(x, b, g, width: int, shift: int, runs: bool = False) -> bytes:
    import numpy as np

    if not supports(width, shift) or not len(x) == len(b) == len(g) or len(x) % width:
        raise ValueError(f"{_name(runs)} encode: sizes, width or shift do not fit")
    lay = _BlockLayout(b, g, width, shift)
    mask, sign = lay.mask, lay.sign
    delta = ((_ordered(np.frombuffer(x, dtype=lay.utype).astype(np.int64), sign) - lay.ob) & mask).tolist()
    models, enc, hot = _Blocks(1 << (lay.bits - 1 - shift)), _Encoder(), 0
    blocks = lay.blocks()
    coded_runs = _runs(blocks, lambda parts: any(delta[i] for z in parts for i in z)) if runs else None

    def magnitude(k: _Key, escape, mag: int) -> None:
        if runs:
            enc.log_magnitude(k, *escape, mag)
        else:
            enc.magnitude(k.mag, *escape, mag)

    for at, (parts, a) in enumerate(blocks):
        if parts:
            changed = any(delta[i] for z in parts for i in z)
            if not runs:
                enc.bit(models.block_bit(lay.exp, parts, hot), int(changed))
                hot = int(changed)
            elif coded_runs[at] is not None:
                run = coded_runs[at]
                enc.bit(models.block_bit(lay.exp, parts, hot), int(run == 0))
                if run:
                    enc.golomb(*models.run[hot], run)
                hot = int(run == 0)
            any_part, last_part = False, 0
            for p, z in enumerate(parts if changed else ()):
                part_changed = int(any(delta[i] for i in z))
                if p + 1 < len(parts) or any_part:  # else implied: the block's only changed part
                    enc.bit(models.sub[2 * min(lay.exp[i] for i in z) + last_part], part_changed)
                last_part = part_changed
                if not part_changed:
                    continue
                any_part, seen_change, last = True, False, 0
                for t, i in enumerate(z):
                    k = models.key(0, lay.exp[i])
                    ch = int(delta[i] != 0)
                    if t + 1 < len(z) or seen_change:  # else implied: the part's only change
                        enc.bit(k.after if last else k.flag, ch)
                    last = ch
                    if ch:
                        seen_change = True
                        negative = int(delta[i] & sign != 0)
                        enc.bit(k.sign, negative)
                        magnitude(k, models.escape[0], ((-delta[i]) & mask) if negative else delta[i])
        for i in a:
            cls = lay.cls[i]
            k = models.key(cls, lay.exp[i])
            ch = delta[i] != 0
            negative = int(delta[i] & sign != 0)
            mag = ((-delta[i]) & mask) if negative else delta[i]
            again = ch and negative == (cls > 3) and mag == lay.size[i]
            enc.bit(k.flag, int(again))  # moved again as before: the same way, as far
            if again:
                continue
            enc.bit(k.after, int(ch))
            if ch:
                same_way = negative == (cls > 3)
                enc.bit(k.again, int(same_way))  # the same way (another size)
                magnitude(k, models.escape[cls], mag - 1 if same_way and mag > lay.size[i] else mag)
    return enc.finish()


def _name(runs: bool) -> str:
    return "STEP_RUNS" if runs else "STEP_BLOCKS"


def _decode_blocks_py(data, b, g, width: int, shift: int, runs: bool = False) -> bytes:
    import numpy as np

    name = _name(runs)
    if not supports(width, shift) or len(b) != len(g) or len(b) % width:
        raise CorruptObject(f"{name} payload: sizes, width or shift do not fit")
    lay = _BlockLayout(b, g, width, shift)
    mask, sign = lay.mask, lay.sign
    models, dec, hot = _Blocks(1 << (lay.bits - 1 - shift)), _Decoder(data), 0
    where, deltas = [], []
    pending = -1  # STEP_RUNS: blocks with unmoved elements still to pass unchanged; -1: no run coded

    def value(i: int, k: _Key, cls: int, negative: int, skip: int = 0) -> None:
        mag = dec.log_magnitude(k, *models.escape[cls], lay.bits - 1) if runs \
            else dec.magnitude(k.mag, *models.escape[cls], lay.bits - 1)
        if skip and mag >= skip:  # a moved element's size before, coded apart
            mag += 1
        if mag > sign or (not negative and mag == sign):
            raise CorruptObject(f"{name} payload: a delta is out of range")
        where.append(i)
        deltas.append(((-mag) & mask) if negative else mag)

    blocks = lay.blocks()
    for at, (parts, a) in enumerate(blocks):
        changed = 0
        if parts and not runs:
            changed = dec.bit(models.block_bit(lay.exp, parts, hot))
            hot = changed
        elif parts:
            if pending < 0:
                empty = dec.bit(models.block_bit(lay.exp, parts, hot))
                pending = 0 if empty else dec.golomb(*models.run[hot], BUCKETS)
                if pending > len(blocks) - at:
                    raise CorruptObject(f"{name} payload: a run passes the end of the chunk")
                hot = int(pending == 0)
            changed = int(pending == 0)
            pending = -1 if changed else pending - 1
        any_part, last_part = False, 0
        for p, z in enumerate(parts if changed else ()):
            last_part = dec.bit(models.sub[2 * min(lay.exp[i] for i in z) + last_part]) \
                if p + 1 < len(parts) or any_part else 1
            if not last_part:
                continue
            any_part, seen_change, last = True, False, 0
            for t, i in enumerate(z):
                k = models.key(0, lay.exp[i])
                last = dec.bit(k.after if last else k.flag) if t + 1 < len(z) or seen_change else 1
                if last:
                    seen_change = True
                    value(i, k, 0, dec.bit(k.sign))
        for i in a:
            cls = lay.cls[i]
            k = models.key(cls, lay.exp[i])
            negative = int(cls > 3)
            if dec.bit(k.flag):  # moved again as before
                size = lay.size[i]
                if size > sign or (not negative and size == sign):
                    raise CorruptObject(f"{name} payload: a delta is out of range")
                where.append(i)
                deltas.append(((-size) & mask) if negative else size)
                continue
            if not dec.bit(k.after):
                continue
            if dec.bit(k.again):  # the same way, another size
                value(i, k, cls, negative, lay.size[i])
            else:  # moved back
                value(i, k, cls, 1 - negative)
    if pending > 0:
        raise CorruptObject(f"{name} payload: a run passes the end of the chunk")
    if dec.at != len(dec.data):
        raise CorruptObject(f"{name} payload length does not match its contents")
    out = np.frombuffer(b, dtype=lay.utype).copy()
    if where:
        idx = np.asarray(where, dtype=np.int64)
        out[idx] = _ordered((lay.ob[idx] + np.asarray(deltas, dtype=np.int64)) & mask, sign).astype(lay.utype)
    return out.tobytes()
