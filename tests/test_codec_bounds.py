"""A payload's parameters are tied to a real float's exponent layout on every decode path
(issue 37, finding 21: on the numpy path a ~160-byte ULP_EXP payload with parameter 0 for F32
sized a 2**31-entry table, 16.8 GB; F64 with 4 raised numpy's _ArrayMemoryError)."""

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # before the fix: MemoryError, not CorruptObject
    import numpy as np
    from wvc import codec
    from wvc.codec import native
    from wvc.codec.container import Method
    from wvc.errors import CorruptObject
    from wvc.formats.dtypes import DTYPES
    assert native.kernels is None, "the numpy path is under test"
    name, param = sys.argv[1], int(sys.argv[2])
    dt = {"F32": np.float32, "F64": np.float64, "BF16": np.uint16}[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(256).astype(dt if name != "BF16" else np.float32)
    if name == "BF16":
        x = (x.view(np.uint32) >> 16).astype(np.uint16)
    b = (x + 1).astype(x.dtype) if name != "BF16" else x ^ 1
    raw, base = x.tobytes(), b.tobytes()
    payload = bytearray(codec.encode(raw, DTYPES[name], base, method=Method.ULP_EXP).payload)
    assert codec.decode(bytes(payload), len(raw), base) == raw
    payload[3] = param
    try:
        codec.decode(bytes(payload), len(raw), base)
    except CorruptObject as exc:
        print("corrupt:", exc)
    else:
        print("decoded")
""")


@pytest.mark.parametrize("dtype,param", [("F32", 0), ("F32", 1), ("F64", 4), ("F64", 0), ("BF16", 0)])
def test_a_ulp_exp_parameter_no_float_has_is_corrupt_on_the_numpy_path(dtype, param):
    import os

    r = subprocess.run([sys.executable, "-c", PROBE, dtype, str(param)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "WVC_NO_NATIVE": "1", "WVC_REQUIRE_NATIVE": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("corrupt: bad codec parameter"), r.stdout


@pytest.mark.parametrize("dtype,param", [("F32", 0), ("F64", 4)])
def test_the_same_payloads_are_corrupt_on_the_native_path(dtype, param):
    from wvc.codec import native

    if native.kernels is None:
        pytest.skip("no C kernels built")
    import numpy as np

    from wvc import codec
    from wvc.codec.container import Method
    from wvc.errors import CorruptObject
    from wvc.formats.dtypes import DTYPES

    x = np.random.default_rng(0).standard_normal(256).astype(np.float32 if dtype == "F32" else np.float64)
    raw, base = x.tobytes(), (x + 1).tobytes()
    payload = bytearray(codec.encode(raw, DTYPES[dtype], base, method=Method.ULP_EXP).payload)
    payload[3] = param
    with pytest.raises(CorruptObject):
        codec.decode(bytes(payload), len(raw), base)
