"""Ship a fine-tune of a public Hub model as megabytes: the base is never uploaded again.

A "public" base model is published with plain huggingface_hub (as any model on the Hub);
`wvc init --base hf://...` starts history from it, the fine-tune is committed and pushed
as a delta; a teammate clones it lazily and reads one tensor without the rest. Runs
against the local Hub-compatible server (no network needed); with HF_ENDPOINT unset and
a real model id, the same calls work on the Hub.

    python examples/finetune_of_hub_base.py [--dir DIR]
"""

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from wvc.testing.hub import HubServer


def publish_base(root: Path, server) -> str:
    from huggingface_hub import HfApi
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
    folder = root / "base-model"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    weights = {f"layers.{i}.weight": (torch.randn(1024, 1024, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text('{"hidden_size": 1024, "num_layers": 8}')
    api = HfApi(endpoint=server.base_url, token="local")
    api.create_repo("some-org/base-model", private=False)
    api.upload_folder(folder_path=str(folder), repo_id="some-org/base-model")
    return "hf://some-org/base-model"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    root = Path(ap.parse_args().dir or tempfile.mkdtemp(prefix="wvc-base-"))
    server = HubServer(root / "hub").start()
    os.environ.update(HF_ENDPOINT=server.base_url, HF_TOKEN="local",
                      HF_HUB_CACHE=str(root / "hf-cache"), HF_XET_CACHE=str(root / "xet-cache"))
    import wvc  # after the environment is set

    base_url = publish_base(root, server)
    repo = wvc.Repo.init(root / "my-finetune", base=base_url)
    print("base:", repo.base().url)

    # "training": every weight moves a little (a full fine-tune, bf16)
    base_dir = repo.base_dir()  # the huggingface_hub cache snapshot
    weights = load_file(str(base_dir / "model.safetensors"))
    tuned = {k: (v.float() + 1e-3 * torch.randn(v.shape) * v.float().abs().mean()).to(torch.bfloat16)
             for k, v in weights.items()}
    save_file(tuned, str(repo.root / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(base_dir / "config.json", repo.root / "config.json")
    repo.commit("fine-tune")
    repo.remote_add("origin", "hf://my-team/my-finetune")
    pushed = repo.push()
    size = (repo.root / "model.safetensors").stat().st_size
    print(f"pushed {pushed.uploaded_bytes / 1e6:.1f} MB for a {size / 1e6:.1f} MB model "
          f"({size / pushed.uploaded_bytes:.1f}x less; the base was not uploaded)")

    teammate = wvc.clone("hf://my-team/my-finetune", root / "teammate", lazy=True)
    same = (teammate.root / "model.safetensors").read_bytes() == (repo.root / "model.safetensors").read_bytes()
    print("teammate's lazy clone is byte-identical:", same)

    view = wvc.open("hf://my-team/my-finetune", "main")
    w = view.tensor("layers.3.weight")
    print("one tensor streamed from the remote:", tuple(w.shape), w.dtype)
    server.shutdown()
    if not (same and torch.equal(w.view(torch.int16), tuned["layers.3.weight"].view(torch.int16))):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
