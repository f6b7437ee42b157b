"""A clone onto a full disk says which local write failed, never the remote's path, and
leaves nothing behind (issue 37, finding 28). Runs on a real, small tmpfs."""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from wvc import Repo


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()[:80]})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_clone_onto_a_full_disk_names_the_local_write(tmp_path, small_fs, lazy):
    src = Repo.init(tmp_path / "src")
    save_file({"w": torch.randn(1024, 1024)}, str(src.root / "model.safetensors"))  # 4 MiB: more than fits
    src.commit("one")
    remote = tmp_path / "remote"
    src.remote_add("origin", str(remote))
    src.push()
    args = [sys.executable, "-m", "wvc", "clone", *(["--lazy"] if lazy else []), str(remote), "c"]
    r = subprocess.run(args, cwd=small_fs, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no space left on device" in r.stderr
    assert str(remote) not in r.stderr, r.stderr  # the remote's file was read fine
    if " writing " in r.stderr:
        assert str(small_fs) in r.stderr
    assert os.listdir(small_fs) == []  # nothing left behind
