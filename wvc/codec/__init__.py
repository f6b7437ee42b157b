"""The chunk codec: how one chunk's raw bytes become stored bytes and back.

The transforms run on numpy on the CPU and on torch for a GPU device (see
:mod:`wvc.codec.backends`); torch is imported only when a GPU device is asked for.

The interface is two functions over bytes; every payload starts with a version byte, so a
later codec can be added beside this one and old payloads still decode.
"""

from __future__ import annotations

from .container import CODEC_VERSION, Method, PayloadInfo, peek

__all__ = ["CODEC_VERSION", "Method", "PayloadInfo", "peek", "encode", "decode", "decode_on_keyframe", "Encoded"]


def encode(raw, dtype, base=None, *, context=None, device: str = "cpu", level: int = 1, method=None):
    """Encode ``raw`` (bytes-like) of ``dtype`` (a :class:`~wvc.formats.dtypes.DType`).

    With ``base`` (the raw bytes of the same chunk in the parent version) delta encodings
    compete with the full one; the smallest wins. ``context``: the raw bytes of the chunk
    the base itself is stored as a delta against (the version before the base), which
    lets a step coder (STEP_RUNS or STEP_BLOCKS) code this step's change given the step before. Returns an :class:`Encoded`.
    """
    from .transforms import encode_chunk

    return encode_chunk(raw, dtype, base, context=context, device=device, level=level, method=method)


def decode(payload, raw_size: int, base=None, *, context=None, device: str = "cpu") -> bytes:
    """Decode a payload to exactly ``raw_size`` bytes (bounded: never allocates more).

    ``context``: the base's own base, as bytes or a function returning them, called only
    when the payload needs it (``peek(payload).method.uses_context``)."""
    from .transforms import decode_chunk

    return decode_chunk(payload, raw_size, base, context=context, device=device)


def decode_step_changes(payload, raw_size: int, base, positions, values,
                        width: int | None = None) -> tuple[bytes, ...] | None:
    """A step payload decoded in a context given by where it differs from ``base`` (int32
    ``positions`` and ``values``), with the elements it changes (positions, old and new
    elements); None for a payload of another method or element width (``width``, where given;
    transforms.decode_step_changes)."""
    from .transforms import decode_step_changes

    return decode_step_changes(payload, raw_size, base, positions, values, width)


def decode_sparse_changes(payload, raw_size: int, base, width: int) -> tuple[bytes, ...] | None:
    """A SPARSE payload decoded over ``base``, with the elements it changes (positions in
    elements of ``width`` bytes, old and new elements) read off its list; None for a payload
    of another method or width (transforms.decode_sparse_changes)."""
    from .transforms import decode_sparse_changes

    return decode_sparse_changes(payload, raw_size, base, width)


def decode_on_keyframe(payload, keyframe, raw_size: int) -> bytes | None:
    """``decode(payload, raw_size, decode(keyframe, raw_size))`` in one pass that never
    materialises the base, for the pairs that allow it (see transforms.decode_on_keyframe);
    None for the others."""
    from .transforms import decode_on_keyframe

    return decode_on_keyframe(payload, keyframe, raw_size)


def __getattr__(name):
    if name == "Encoded":
        from .transforms import Encoded

        return Encoded
    raise AttributeError(name)
