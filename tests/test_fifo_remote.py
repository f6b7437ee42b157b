"""A FIFO where a directory remote's pack should be is refused at once, never read
(issue 37, finding 24: `clone --lazy` and `wvc.open(...).read_file` blocked forever)."""

import os

import pytest

import wvc
from wvc import Repo
from wvc.errors import WvcError

from .test_everyday import run, two_tensors


def test_a_fifo_in_place_of_a_pack_is_an_error_not_a_hang(tmp_path):
    repo = Repo.init(tmp_path / "src")
    two_tensors(repo.root / "model.safetensors")
    repo.commit("one")
    remote = tmp_path / "remote"
    repo.remote_add("origin", str(remote))
    repo.push()
    view = wvc.open(str(remote), "main")  # listed and indexed before the swap
    (pack,) = list((remote / "packs").glob("*.pack"))
    pack.unlink()
    os.mkfifo(pack)
    with pytest.raises(WvcError, match="not a regular file"):
        view.read_file("model.safetensors")
    for args in (("clone", remote, "plain"), ("clone", "--lazy", remote, "lazy2")):
        r = run(tmp_path, *args, check=False)  # timeout=120 in run(): a hang fails the test
        assert r.returncode == 1 and "not a regular file" in r.stderr, r.stderr
    with pytest.raises(WvcError, match="not a regular file"):
        wvc.open(str(remote), "main").read_file("model.safetensors")
