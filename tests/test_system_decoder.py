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


def test_the_decoder_cannot_change_once_a_context_exists():
    """This process has decoded (a context per thread exists): a switch now would free those
    contexts with the other library's functions, so it is refused and nothing changes."""
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


def test_the_bundled_decoder_is_kept_when_asked():
    bundled, version, _ = run_decodes("0")
    assert bundled == "None"
