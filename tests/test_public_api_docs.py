"""The public API documents itself, and a missing extra says how to get it (issue 37,
finding 16)."""

import inspect
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _own_public_members(cls):
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        owner = next((b for b in cls.__mro__ if name in b.__dict__), None)
        if owner is None or not owner.__module__.startswith("wvc"):
            continue  # inherited from a framework (Trainer callbacks, DCP's storage protocol)
        if any(name in b.__dict__ for b in cls.__mro__[1:] if not b.__module__.startswith("wvc")):
            continue  # an override of a framework hook, documented by the framework
        fn = member.fget if isinstance(member, property) else member
        if inspect.isfunction(fn) or inspect.ismethod(fn):
            yield name, fn


def test_every_public_class_function_and_method_has_a_docstring():
    import wvc
    from wvc.api import Repo
    from wvc.read.follower import Follower, follow
    from wvc.integrations.dcp import WvcStorageReader, WvcStorageWriter
    from wvc.integrations.transformers import WvcCallback
    from wvc.integrations.publisher import Publisher
    from wvc.read.view import VersionView, open_version, snapshot_download

    missing = []
    for cls in (Repo, VersionView, Follower, Publisher, WvcCallback, WvcStorageWriter, WvcStorageReader):
        if not inspect.getdoc(cls):
            missing.append(cls.__name__)
        missing += [f"{cls.__name__}.{n}" for n, fn in _own_public_members(cls) if not fn.__doc__]
    missing += [f.__name__ for f in (open_version, snapshot_download, follow, wvc.clone) if not f.__doc__]
    assert missing == [], missing


def test_repo_commit_spells_out_its_keyword_arguments():
    from wvc.api import Repo

    params = inspect.signature(Repo.commit).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())
    assert {"metadata", "allow_empty", "branch", "amend", "exclude", "device", "author"} <= set(params)


def test_the_callback_without_transformers_says_which_extra_to_install(tmp_path):
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(textwrap.dedent("""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "transformers" or name.startswith("transformers."):
                    raise ImportError("No module named 'transformers'")
        sys.meta_path.insert(0, _Block())
    """))
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    r = subprocess.run([sys.executable, "-c", "from wvc.integrations.transformers import WvcCallback"],
                       capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "pip install 'wvc[train]'" in r.stderr


def test_the_license_is_in_the_repository_and_the_wheel(tmp_path):
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr.strip()[-200:]}")
    (wheel,) = tmp_path.glob("wvc-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert any(n.endswith("licenses/LICENSE") for n in z.namelist())
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
