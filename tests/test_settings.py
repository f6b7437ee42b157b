"""Environment switches read the same way everywhere (issue 52, item 5): ``WVC_NO_NATIVE=0``
used to switch the C kernels off (any non-empty value counted), while ``WVC_SYSTEM_ZSTD=0``
switched the system decoder off; now 1/true/yes/on is on, 0/false/no/off is off, unset or
empty is the default, anything else one clear error."""

import os
import subprocess
import sys

import pytest

from wvc import settings
from wvc.errors import InvalidArgument


@pytest.mark.parametrize("value, want", [("1", True), ("true", True), ("YES", True), ("on", True),
                                         ("0", False), ("false", False), ("No", False), ("off", False)])
def test_a_switch_reads_on_and_off_words(monkeypatch, value, want):
    monkeypatch.setenv("WVC_NO_WHOLE_PAYLOADS", value)
    assert settings.switch("WVC_NO_WHOLE_PAYLOADS") is want
    assert settings.switch("WVC_NO_WHOLE_PAYLOADS", default=not want) is want


def test_unset_or_empty_is_the_default_and_anything_else_an_error(monkeypatch):
    monkeypatch.delenv("WVC_SYSTEM_ZSTD", raising=False)
    assert settings.switch("WVC_SYSTEM_ZSTD", True) is True
    monkeypatch.setenv("WVC_SYSTEM_ZSTD", "")
    assert settings.switch("WVC_SYSTEM_ZSTD", True) is True
    monkeypatch.setenv("WVC_SYSTEM_ZSTD", "maybe")
    with pytest.raises(InvalidArgument, match="WVC_SYSTEM_ZSTD='maybe' is not a switch"):
        settings.switch("WVC_SYSTEM_ZSTD", True)


def _kernels_loaded(value: str) -> str:
    env = {**os.environ, "WVC_NO_NATIVE": value}
    out = subprocess.run([sys.executable, "-c", "import wvc.codec.native as n, wvc.codec.step_coder as s; "
                          "print(n.kernels is not None, s._c is not None)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_wvc_no_native_0_keeps_the_c_kernels_and_1_drops_them():
    import wvc.codec.native as native

    if native.kernels is None and not settings.switch("WVC_NO_NATIVE"):
        pytest.skip("the C kernels are not built here")  # (CI builds them: WVC_REQUIRE_NATIVE)
    assert _kernels_loaded("0") == "True True"
    assert _kernels_loaded("1") == "False False"
