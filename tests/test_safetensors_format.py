"""The header parser accepts what safetensors writes and rejects malformed headers."""

import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from safetensors.torch import save

from wvc.errors import SafetensorsFormatError
from wvc.formats import safetensors as st
from wvc.formats.dtypes import DTYPES

from .conftest import ALL_DTYPES, random_tensor


def parse_bytes(blob: bytes) -> st.SafetensorsHeader:
    (n,) = struct.unpack("<Q", blob[:8])
    st.read_header_length(blob[:8], len(blob), "t")
    return st.parse_header(blob[8 : 8 + n], len(blob) - 8 - n, "t")


def test_parses_every_dtype_as_written_by_safetensors():
    sd = {f"t_{name}": random_tensor(dt, (3, 5), i) for i, (name, dt) in enumerate(ALL_DTYPES.items())}
    sd["scalar"] = torch.tensor(1.5)
    sd["empty"] = torch.empty(0, 4)
    blob = save(sd, metadata={"format": "pt"})
    header = parse_bytes(blob)
    assert header.metadata == {"format": "pt"}
    assert {t.name for t in header.tensors} == set(sd)
    assert header.file_size == len(blob)
    for t in header.tensors:
        assert t.shape == tuple(sd[t.name].shape)


def test_build_header_matches_the_library_byte_for_byte():
    sd = {f"{chr(97 + i)}_{name}": random_tensor(dt, (2, 3), i) for i, (name, dt) in enumerate(reversed(list(ALL_DTYPES.items())))}
    sd["zz_scalar"] = torch.tensor(2.0, dtype=torch.bfloat16)
    # Only 0 or 1 metadata keys: safetensors serializes __metadata__ from a Rust HashMap,
    # so with several keys even the library's own output order varies from run to run.
    for metadata in (None, {"format": "pt"}, {"note": "é"}):
        blob = save(sd, metadata=metadata)
        (n,) = struct.unpack("<Q", blob[:8])
        specs = [(k, DTYPES[_name(v.dtype)], tuple(v.shape)) for k, v in sd.items()]
        built, _ = st.build_header(specs, metadata)
        assert built == blob[8 : 8 + n]


def _name(dtype):
    return next(k for k, v in ALL_DTYPES.items() if v == dtype)


def good_header():
    return {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "I8", "shape": [4], "data_offsets": [8, 12]}}


def blob_of(header, data_len=12, n=None):
    hb = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(hb) if n is None else n) + hb + bytes(data_len)


def test_good_header_parses():
    assert [t.name for t in parse_bytes(blob_of(good_header())).tensors] == ["a", "b"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda h: h["a"].update(dtype="F33"), "unknown dtype"),
        (lambda h: h["a"].update(shape=[3]), "needs 12 bytes"),
        (lambda h: h["b"].update(data_offsets=[4, 8]), "overlap"),
        (lambda h: h["b"].update(data_offsets=[9, 13]), "hole"),
        (lambda h: h["a"].update(shape=[-2]), "invalid shape"),
        (lambda h: h["a"].update(data_offsets=[8, 0]), "invalid data_offsets"),
        (lambda h: h["a"].update(extra=1), "exactly dtype"),
        (lambda h: h.update(__metadata__={"k": 1}), "__metadata__"),
    ],
)
def test_rejects_malformed_tensor_entries(mutate, message):
    h = good_header()
    mutate(h)
    with pytest.raises(SafetensorsFormatError, match=message):
        parse_bytes(blob_of(h))


def test_rejects_duplicate_names():
    hb = b'{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"I8","shape":[1],"data_offsets":[1,2]}}'
    with pytest.raises(SafetensorsFormatError, match="duplicate"):
        parse_bytes(blob_of(hb, 2))


@pytest.mark.parametrize("hb", [b"{not json", b"[1,2]", b'{"a": NaN}', b"\xff\xfe"])
def test_rejects_invalid_json(hb):
    with pytest.raises(SafetensorsFormatError):
        parse_bytes(blob_of(hb, 0))


def test_rejects_huge_or_truncated_header_length():
    with pytest.raises(SafetensorsFormatError, match="out of bounds"):
        st.read_header_length(struct.pack("<Q", 2**63), 100, "t")
    with pytest.raises(SafetensorsFormatError, match="past the end"):
        st.read_header_length(struct.pack("<Q", 1000), 100, "t")
    with pytest.raises(SafetensorsFormatError, match="too short"):
        st.read_header_length(b"\x01\x02", 2, "t")


def test_rejects_data_section_of_wrong_size():
    with pytest.raises(SafetensorsFormatError, match="cover"):
        parse_bytes(blob_of(good_header(), data_len=20))


@settings(max_examples=200, deadline=None)
@given(hs.binary(max_size=300))
def test_fuzz_parser_never_crashes_uncontrolled(blob):
    """Any bytes either parse or raise SafetensorsFormatError (never another exception)."""
    try:
        if len(blob) >= 8:
            (n,) = struct.unpack("<Q", blob[:8])
            st.read_header_length(blob[:8], len(blob), "t")
            st.parse_header(blob[8 : 8 + n], len(blob) - 8 - n, "t")
    except SafetensorsFormatError:
        pass
