"""Decompression with the system's libzstd (native.system_decoder): used where it is there and
fast (x86-64, native.MIN_SYSTEM_DECODER or later), the same bytes as python-zstandard's own decoder, refused once a
context of the other library exists, and off with WVC_SYSTEM_ZSTD=0."""

import ctypes
import os
import subprocess
import sys

import pytest

from wvc.codec import native

pytestmark = pytest.mark.skipif(not native.whole_payloads, reason="needs the C kernels' whole payloads")


def system_libzstd_version() -> int | None:
    try:
        lib = ctypes.CDLL(native.SYSTEM_LIBZSTD)
    except OSError:
        return None
    lib.ZSTD_versionNumber.restype = ctypes.c_uint
    return lib.ZSTD_versionNumber()


HAS_FAST_SYSTEM_DECODER = (os.uname().machine == "x86_64"
                           and (system_libzstd_version() or 0) >= native.MIN_SYSTEM_DECODER)

# Decodes a spread of payloads (every method and dtype, chains, the one-pass decode over a
# keyframe) and prints the blake3 of all the results, with whichever decoder the process has.
DECODE_SCRIPT = r"""
import blake3, torch
from wvc import codec
from wvc.codec import native
from wvc.codec.transforms import applicable_methods
from wvc.formats.dtypes import DTYPES
from tests.test_codec import related_pair
from tests.test_whole_payloads import weights_pair
h = blake3.blake3()
for name in sorted(DTYPES):
    dtype = DTYPES[name]
    for n, p in ((0, 0.0), (1000, 0.01), (70_000, 0.3), (300_000, 1.0)):
        raw, base = related_pair(n * dtype.width, p, seed=n + len(name))
        for method in applicable_methods(dtype, True):
            b = base if method.uses_base else None
            payload = codec.encode(raw, dtype, b, method=method).payload
            out = codec.decode(payload, len(raw), b)
            assert out == raw, (name, method)
            h.update(out)
for torch_dtype in (torch.bfloat16, torch.float32):
    new, base = weights_pair(200_000, 7, torch_dtype)
    dtype = DTYPES["BF16" if torch_dtype is torch.bfloat16 else "F32"]
    key = codec.encode(base, dtype, None).payload
    delta = codec.encode(new, dtype, base).payload
    out = codec.decode_on_keyframe(delta, key, len(new))
    assert out == new
    h.update(out)
print(native.system_decoder, native.kernels.decoder_version(), h.hexdigest())
"""


def run_decodes(env_value: str | None) -> tuple[str, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WVC_SYSTEM_ZSTD"}
    if env_value is not None:
        env["WVC_SYSTEM_ZSTD"] = env_value
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", DECODE_SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return tuple(out.stdout.split())


@pytest.mark.skipif(not HAS_FAST_SYSTEM_DECODER, reason="no x86-64 system libzstd new enough here")
def test_the_system_decoder_is_used_where_it_is_fast_and_decodes_the_same_bytes():
    system, system_version, system_digest = run_decodes(None)
    bundled, bundled_version, bundled_digest = run_decodes("0")
    assert int(system) == int(system_version) == system_libzstd_version()
    assert bundled == "None"
    import zstandard

    major, minor, patch = zstandard.ZSTD_VERSION
    assert int(bundled_version) == major * 10000 + minor * 100 + patch
    assert system_digest == bundled_digest  # (and each run checked every result against its source)


@pytest.mark.skipif(native.system_decoder is None, reason="this process decodes with the bundled zstd")
def test_the_system_decoder_cannot_be_replaced_once_it_has_contexts():
    """This process has decoded with the system's library (a context per thread exists): a
    replacement now would free those contexts with another library's functions, so it is
    refused and nothing changes."""
    from wvc import codec
    from wvc.formats.dtypes import DTYPES

    raw = bytes(range(256)) * 64
    assert codec.decode(codec.encode(raw, DTYPES["U8"], None).payload, len(raw), None) == raw
    before = native.kernels.decoder_version()
    import zstandard

    functions = native._zstd_functions(zstandard)
    names = dict(zip(native.ZSTD_FUNCTIONS, functions))
    assert native.kernels.use_zstd_decoder(tuple(names[n] for n in native.DECODER_FUNCTIONS)) is False
    assert native.kernels.decoder_version() == before


# A "system" decoder that gets every frame of more than 64 bytes wrong (its first byte), put
# in before anything is decoded; then a fine-tune is committed and checked out.
WRONG_DECODER_SCRIPT = r"""
import ctypes, sys, zstandard
from pathlib import Path
from wvc.codec import native
assert native.system_decoder is None  # (WVC_SYSTEM_ZSTD=0: nothing connected at import)
lib = ctypes.CDLL(native._cffi_path(zstandard))
real = lib.ZSTD_decompressDCtx
real.restype = ctypes.c_size_t
real.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)

@ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
def wrong(dctx, dst, capacity, src, size):
    got = real(dctx, dst, capacity, src, size)
    if 64 < got < capacity + 1:
        ctypes.memset(dst, (ctypes.c_ubyte.from_address(dst).value + 1) % 256, 1)
    return got

functions = dict(zip(native.ZSTD_FUNCTIONS, native._zstd_functions(zstandard)))
functions["ZSTD_decompressDCtx"] = ctypes.cast(wrong, ctypes.c_void_p).value
native.system_decoder = native.kernels.use_zstd_decoder(tuple(functions[n] for n in native.DECODER_FUNCTIONS))
assert native.system_decoder
from tests.test_delta_on_keyframe import _fine_tune
repo, commit, expected = _fine_tune(Path(sys.argv[1]))
repo.checkout(commit, output=Path(sys.argv[1]) / "out", force=True)
assert (Path(sys.argv[1]) / "out" / "model.safetensors").read_bytes() == expected
import zstandard
major, minor, patch = zstandard.ZSTD_VERSION
assert native.system_decoder is None
assert native.kernels.decoder_version() == major * 10000 + minor * 100 + patch
print("identical")
"""


def test_a_system_decoder_that_decodes_wrongly_is_dropped_and_the_bytes_stay_right(tmp_path):
    """A chunk that fails its hash check after the system's decoder is decoded again with
    python-zstandard's: when that one gets it right, the library was at fault, not the
    repository: the bytes come out right, one warning names it, and the process decodes
    with the bundled zstd from then on."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "WVC_SYSTEM_ZSTD": "0"}
    out = subprocess.run([sys.executable, "-c", WRONG_DECODER_SCRIPT, str(tmp_path)], env=env, cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["identical"]
    warnings = [line for line in out.stderr.splitlines() if "decoded a chunk wrongly" in line]
    assert len(warnings) == 1, out.stderr


@pytest.mark.skipif(native.system_decoder is None, reason="this process decodes with the bundled zstd")
def test_a_damaged_chunk_is_still_damaged_and_the_system_decoder_stays(tmp_path):
    """The bundled decoder gets a damaged chunk wrong too: the error names the object, as
    before, and the system's decoder, not at fault, stays in use."""
    from wvc.errors import CorruptObject
    from wvc.store.packs import pack_filename

    from .test_delta_on_keyframe import _fine_tune

    repo, _, _ = _fine_tune(tmp_path)
    store = repo.internals.store
    (oid,) = next(iter(store.db.query("SELECT id FROM objects WHERE depth = 1 LIMIT 1")))
    row = store.chain(oid)[0]
    pack = store.reader.directory / pack_filename(row.pack)
    data = bytearray(pack.read_bytes())
    data[row.offset + row.length - 5] ^= 0x40
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    version = native.system_decoder
    with pytest.raises(CorruptObject, match=row.id[:8]):
        store.get(row.id)
    assert native.system_decoder == version == native.kernels.decoder_version()


def test_the_bundled_decoder_is_kept_when_asked():
    bundled, version, _ = run_decodes("0")
    assert bundled == "None"
