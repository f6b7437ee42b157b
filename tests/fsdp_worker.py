"""One rank of an FSDP2 training run with WvcCallback(every_n_steps=1), run as its own
process by tests/test_trainer_commits.py (gloo on CPU; the parameters sharded with
fully_shard, so reading them needs every rank).

    python -m tests.fsdp_worker RANK WORLD PORT REPO REPORT
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import types

import torch
import torch.distributed as dist


def main(rank: int, world: int, port: int, repo: str, report: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import TrainerControl, TrainerState

    from tests import trl_helpers
    from wvc.integrations.transformers import WvcCallback

    model = trl_helpers.model(tied=False)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cb = WvcCallback(repo, every_n_steps=1, branch="run/fsdp", max_pending=100)
    args = types.SimpleNamespace(output_dir="out", run_name=None, resume_from_checkpoint=None)
    state = TrainerState(is_world_process_zero=rank == 0, is_local_process_zero=rank == 0)
    control = TrainerControl()
    cb.on_train_begin(args, state, control, model=model, processing_class=trl_helpers.tokenizer())
    g = torch.Generator().manual_seed(rank)
    for step in (1, 2):
        ids = torch.randint(0, 21, (2, 12), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        state.global_step = step
        cb.on_step_end(args, state, control, model=model)
        state.log_history.append({"loss": float(step), "step": step})
        cb.on_log(args, state, control, model=model)
    cb.on_train_end(args, state, control, model=model)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in full.items()}, report + ".weights.safetensors")
        with open(report, "w") as f:
            json.dump({"commits": cb.commits, "errors": cb.push_errors}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
