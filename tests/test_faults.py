"""Fault injection at the I/O layer: failed, short and corrupted writes and reads.

Each fault surfaces as one clear error, and the repository stays consistent: the same
state as before (for writes) and fsck clean.
"""

import errno
import os

import pytest
import torch
from safetensors.torch import save_file

from wvc.errors import CorruptObject
from wvc.store import packs

from .conftest import repo_state


@pytest.fixture
def model_repo(repo, cli):
    save_file({"w": torch.randn(128, 512).to(torch.bfloat16)}, str(repo.root / "model.safetensors"))
    repo.commit("first")
    save_file({"w": torch.randn(128, 512).to(torch.bfloat16)}, str(repo.root / "model.safetensors"))
    return repo


def one_line(result):
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("wvc: error:"), result.output
    return lines[0]


@pytest.mark.parametrize("code, word", [(errno.ENOSPC, "No space left"), (errno.EIO, "Input/output error")])
@pytest.mark.parametrize("nth", [1, 2, 3])  # magic, payload, index
def test_write_failure_in_pack_is_one_clear_error(model_repo, cli, monkeypatch, code, word, nth):
    before = repo_state(model_repo.root)
    calls = []
    real = packs.PackWriter._write

    def failing(self, data):
        calls.append(1)
        if len(calls) == nth:
            raise OSError(code, os.strerror(code))
        return real(self, data)

    monkeypatch.setattr(packs.PackWriter, "_write", failing)
    line = one_line(cli(model_repo.root, "commit", "-m", "doomed"))
    assert word.lower() in line.lower()
    monkeypatch.undo()
    assert repo_state(model_repo.root) == before
    assert not list((model_repo.root / ".wvc" / "packs").glob(".wvc-tmp*"))  # the temp pack was removed
    assert model_repo.fsck().ok


def test_fsync_failure_is_one_clear_error(model_repo, cli, monkeypatch):
    before = repo_state(model_repo.root)

    def eio(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", eio)
    assert "Input/output error" in one_line(cli(model_repo.root, "commit", "-m", "doomed"))
    monkeypatch.undo()
    assert repo_state(model_repo.root) == before
    assert model_repo.fsck().ok


@pytest.mark.parametrize("mode", ["corrupt", "truncate"])
def test_corrupted_or_short_reads_are_caught(model_repo, monkeypatch, mode, tmp_path):
    real = packs.PackReader.view  # (what every decode reads through)

    def bad(self, pack, offset, length):
        data = real(self, pack, offset, length)
        if mode == "truncate":
            raise CorruptObject(f"pack {pack[:12]} is truncated")  # what a view past a pack's end raises
        return memoryview(bytes(data[:-1]) + bytes([data[-1] ^ 0x10]))

    monkeypatch.setattr(packs.PackReader, "view", bad)
    with pytest.raises(CorruptObject):
        model_repo.checkout("HEAD", output=tmp_path / "out")
    monkeypatch.undo()
    model_repo.checkout("HEAD", output=tmp_path / "again")  # nothing was damaged on disk


def test_checkout_write_failure_leaves_files_whole(model_repo, cli, monkeypatch):
    first = model_repo.log()[0].id
    model_repo.commit("second")
    original = (model_repo.root / "model.safetensors").read_bytes()
    import wvc.fsutil as fsutil

    real = os.replace

    def enospc(src, dst):
        if str(dst).endswith("model.safetensors"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", enospc)
    assert "no space left" in one_line(cli(model_repo.root, "checkout", first))
    monkeypatch.undo()
    assert (model_repo.root / "model.safetensors").read_bytes() == original  # old file intact
    assert not [p for p in model_repo.root.iterdir() if p.name.startswith(".wvc-tmp")]
    assert model_repo.head_branch() == "main"
