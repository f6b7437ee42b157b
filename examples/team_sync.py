"""Two teammates share model versions through a Hub remote.

Runs against the local Hub-compatible server (no network needed); point HF_ENDPOINT at the
real Hub and use your own hf://user/repo to do the same for real.

    python examples/team_sync.py [--dir DIR]
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from wvc.testing.hub import HubServer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    root = Path(ap.parse_args().dir or tempfile.mkdtemp(prefix="wvc-team-"))
    server = HubServer(root / "hub").start()
    os.environ.update(HF_ENDPOINT=server.base_url, HF_TOKEN="local",
                      HF_HUB_CACHE=str(root / "hf-cache"), HF_XET_CACHE=str(root / "xet-cache"))
    import wvc  # after the environment is set

    alice = wvc.Repo.init(root / "alice")
    w = torch.randn(1024, 1024) * 0.02
    save_file({"w": w.to(torch.bfloat16)}, str(alice.root / "model.safetensors"))
    alice.commit("alice: base")
    alice.remote_add("origin", "hf://team/shared-model")
    print("alice pushes:", alice.push().uploaded_bytes, "bytes")

    bob = wvc.clone("hf://team/shared-model", root / "bob")
    save_file({"w": (w + 1e-4 * torch.randn(1024, 1024)).to(torch.bfloat16)}, str(bob.root / "model.safetensors"))
    bob.commit("bob: one more epoch")
    print("bob pushes:", bob.push().uploaded_bytes, "bytes (a delta, not the model)")

    pulled = alice.pull()
    print(f"alice pulls: {pulled['old'][:12]} -> {pulled['new'][:12]}, {pulled['downloaded_bytes']} bytes")
    same = (alice.root / "model.safetensors").read_bytes() == (bob.root / "model.safetensors").read_bytes()
    print("alice's working tree now equals bob's:", same)
    server.shutdown()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
