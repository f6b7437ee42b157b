"""Live sync: a training loop publishes every step, an inference worker follows it and
loads only the tensors that changed, the way vLLM's ``model.load_weights`` takes them.

    python examples/live_sync.py --dir /tmp/live-sync [--steps 5]

The remote is a shared directory here; ``push_to="hf://team/policy"`` or
``"s3://bucket/policy"`` work the same way (to the Hub, pushes coalesce to one a minute).
"""

import argparse
from pathlib import Path

import torch

import wvc
from wvc.integrations.publisher import Publisher


def policy() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(torch.bfloat16)


def load_weights(model: torch.nn.Module, weights) -> int:
    """What an inference engine's ``load_weights`` does: copy each given tensor in."""
    params = dict(model.named_parameters())
    n = 0
    for name, tensor in weights:
        params[name].data.copy_(tensor)
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    torch.manual_seed(0)
    trainer_model, inference_model = policy(), policy()
    optimizer = torch.optim.AdamW(trainer_model.parameters(), lr=1e-3)
    remote = args.dir / "shared"
    pub = Publisher(args.dir / "trainer", "main", push_to=str(remote), push_interval=0)
    follower = None

    for step in range(args.steps + 1):
        if step:  # one optimizer step on a toy regression
            x = torch.randn(32, 64, dtype=torch.bfloat16)
            loss = (trainer_model(x) - x.flip(1)).float().pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        pub.publish(trainer_model.state_dict(), message=f"step {step}", metadata={"step": step})
        pub.flush(timeout=60)  # an RL loop waits for the workers here; a trainer need not

        # the inference worker (another process or machine in real use)
        if follower is None:
            follower = wvc.follow("file://" + str(remote), "main")
        update = follower.update(timeout=30)
        loaded = load_weights(inference_model, [(n, follower.state_dict[n]) for n in update.changed])
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(trainer_model.state_dict().values(), inference_model.state_dict().values()))
        print(f"step {step}: {loaded} tensors loaded, {update.downloaded_bytes:,} bytes downloaded, "
              f"identical to the trainer: {same}")
        if not same:
            raise SystemExit("the worker's weights differ from the trainer's")
    pub.close(timeout=60)


if __name__ == "__main__":
    main()
