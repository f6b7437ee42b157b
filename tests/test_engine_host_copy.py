"""The host copy a single-worker vLLM follower starts from (integrations/vllm/session.host_copy):
the engine's checkpoint files read into memory of the process's own, byte for byte (issue 65)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from wvc.errors import WvcError
from wvc.integrations.vllm.session import host_copy


def checkpoint(root: Path) -> Path:
    root.mkdir()
    g = torch.Generator().manual_seed(0)
    save_file({"model.embed_tokens.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
               "model.norm.weight": torch.randn(64, generator=g),
               "empty": torch.empty(0, 3, dtype=torch.float16)}, str(root / "model-00001-of-00002.safetensors"))
    save_file({"lm_head.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
               "step": torch.tensor(7, dtype=torch.int64)}, str(root / "model-00002-of-00002.safetensors"))
    return root


def test_the_host_copy_is_the_files_bytes_in_memory_of_its_own(tmp_path):
    """Every tensor equals safetensors' own read of the files, bit for bit, and none of the
    files stays mapped while the copy lives: safetensors' ``load_file`` maps a file privately
    and lazily, and a server's first update then faulted in and copied every page it wrote
    (494M: 4.7 s against 1.1 s for the next update)."""
    root = checkpoint(tmp_path / "model")
    copy = host_copy(str(root))
    want = {}
    for path in sorted(root.glob("*.safetensors")):
        want.update({k: v.clone() for k, v in load_file(str(path)).items()})
    assert sorted(copy) == sorted(want)
    for name, t in want.items():
        assert copy[name].dtype == t.dtype and copy[name].shape == t.shape
        assert copy[name].reshape(-1).view(torch.uint8).numpy().tobytes() == \
            t.reshape(-1).view(torch.uint8).numpy().tobytes(), name
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(root) in line]
    assert mapped == []


def test_a_truncated_checkpoint_is_one_error(tmp_path):
    root = checkpoint(tmp_path / "model")
    path = root / "model-00002-of-00002.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(WvcError):
        host_copy(str(root))
