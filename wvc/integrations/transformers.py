"""``WvcCallback``: version every checkpoint of a transformers (or TRL) Trainer run.

    from wvc.integrations.transformers import WvcCallback
    trainer = Trainer(..., callbacks=[WvcCallback("runs/wvc", push_to="hf://team/model")])

On each checkpoint save it commits the checkpoint directory the Trainer just wrote (so a
commit is exactly what was saved; optimizer, scheduler and RNG state are left out). With
``every_n_steps`` it also commits from memory between saves, at train begin (the step the
run starts from) and every N steps: each such commit is what ``trainer.save_model`` would
write at that step (``save_pretrained``'s files: config, generation config, weights with
tied weights and safetensors metadata as transformers writes them, a PEFT model's adapter
alone; and the tokenizer), nothing carried over from an earlier checkpoint. Commits go to
a branch of their own per run, carry the step, epoch and that step's metrics as metadata,
and never move the repository's checked-out working tree.

Training waits only while the weights are copied (``wvc.integrations.publisher``): hashing, encoding,
committing and pushing run in the background, with a bounded queue that coalesces to the
newest step when it falls behind (the commit records the steps it skipped). Pushes are
rate-bounded for the Hub (``push_interval``), retried with back-off, flushed at train end
within ``flush_timeout``; errors are logged and collected in ``callback.push_errors``, never
raised into the training loop.

On a multi-rank run every rank takes part in gathering a sharded (FSDP) model's weights;
rank 0 commits. DeepSpeed ZeRO-3 is refused for from-memory commits at train begin (its
parameters gather through DeepSpeed's own collective); checkpoint commits work with it.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

try:
    from transformers import TrainerCallback
except ImportError as exc:  # the callback is for Trainer runs: say how to get what it needs
    raise ImportError("wvc.integrations.transformers needs transformers: pip install 'wvc[train]'") from exc

from .publisher import Publisher

log = logging.getLogger(__name__)

# Trainer state we never version: large, not weights, or rewritten at every save.
CHECKPOINT_EXCLUDES = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "scaler.pt", "training_args.bin",
                       "global_step*/")


def _latest_metrics(state) -> dict:
    """The newest value of each logged metric. A non-finite one (fp16's inf grad_norm, a NaN
    loss) is kept as the string "inf", "-inf" or "nan": JSON has no such numbers, and a
    metric must never fail the training run."""
    metrics = {}
    for entry in state.log_history:
        for k, v in entry.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch"):
                metrics[k] = v if math.isfinite(v) else str(v)
    return metrics


def _unwrap(model):
    """The model itself, out of DDP / FSDP1 / torch.compile wrappers (a PeftModel stays one:
    it saves its adapter)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def _is_multi_rank() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _is_sharded(model) -> bool:
    """FSDP (either version) shards parameters: every rank must take part in reading them."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(m, FullyShardedDataParallel) for m in model.modules()) or \
        any(isinstance(p, DTensor) for p in model.parameters())


def _uses_zero3(model) -> bool:
    return any(hasattr(p, "ds_id") for p in model.parameters())


def save_files(model, processing_class, snapshot, directory: Path) -> None:
    """What ``Trainer.save_model`` writes, from a snapshot of the weights: the model's own
    ``save_pretrained`` given the snapshot (so tied weights, the adapter-only format of a
    PEFT model, sharding and metadata are transformers' and PEFT's own), and the
    tokenizer or processor."""
    target = _unwrap(model)
    if hasattr(target, "save_pretrained"):
        target.save_pretrained(directory, state_dict=dict(snapshot))
    else:  # a bare nn.Module: the Trainer saves its state dict the same way
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in snapshot.items()}, directory / "model.safetensors",
                  metadata={"format": "pt"})
    if processing_class is not None and hasattr(processing_class, "save_pretrained"):
        processing_class.save_pretrained(directory)


class WvcCallback(TrainerCallback):
    def __init__(self, repo_path, *, every_n_steps: int | None = None, on_save: bool = True,
                 branch: str | None = None, push_to: str | None = None, remote: str = "origin",
                 device: str = "auto", max_push_attempts: int = 5, retry_seconds: float = 2.0,
                 flush_timeout: float = 30.0, max_pending: int = 1, push_interval: float | None = None,
                 keep=None, prune_remote: bool = False):
        self.repo_path = Path(repo_path)
        self.every_n_steps = every_n_steps
        self.commit_on_save = on_save
        self.branch = branch
        # the Publisher's settings (wvc/integrations/publisher.py says what each does)
        self.publisher_options = dict(push_to=push_to, remote=remote, device=device, max_pending=max_pending,
                                      push_interval=push_interval, max_push_attempts=max_push_attempts,
                                      retry_seconds=retry_seconds, keep=keep, prune_remote=prune_remote)
        # How long train() may wait at its end for the last commits and push (an unreachable
        # Hub must not hold it through every retry); what is left is reported, `wvc push` sends it.
        self.flush_timeout = flush_timeout
        self.unpushed = False
        self.publisher: Publisher | None = None
        self.pauses: list[float] = []  # seconds training waited for each from-memory snapshot
        self._due = None
        self._processing_class = None

    @property
    def commits(self) -> list[dict]:
        """One dict per commit of this run: commit, step, skipped_steps, seconds, bytes."""
        return self.publisher.commits if self.publisher is not None else []

    @property
    def push_errors(self) -> list[str]:
        """Commit and push failures of this run (they never stop training), oldest first."""
        return self.publisher.errors if self.publisher is not None else []

    # -- lifecycle ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._processing_class = processing_class
        if self.every_n_steps and model is not None and _uses_zero3(model):
            raise ValueError("WvcCallback(every_n_steps=...) cannot gather DeepSpeed ZeRO-3 parameters; "
                             "commit checkpoints instead (on_save) or use ZeRO-2 / FSDP")
        if state.is_world_process_zero:
            from ..api import Repo

            if (self.repo_path / ".wvc").is_dir():
                with Repo.open(self.repo_path) as repo:
                    existing = repo.branches()
            else:
                existing = {}
            # a run of its own unless told (or resuming): another run with the same
            # output_dir name must not become this one's parent
            self.branch = self.branch or _branch_name(args, existing,
                                                      resuming=bool(getattr(args, "resume_from_checkpoint", None)))
            self.publisher = Publisher(self.repo_path, self.branch, **self.publisher_options)
        if self.every_n_steps and model is not None:
            # the weights the run starts from: the first step's commit is then a delta
            snapshot = self._snapshot(model)
            if self.publisher is not None:
                self._publish(f"step {state.global_step}", state, snapshot, model, state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every_n_steps and state.global_step % self.every_n_steps == 0 and model is not None:
            if not (self.commit_on_save and control.should_save):  # the save will be committed
                # The weights are final for this step now (every rank takes part when they
                # are sharded); the Trainer logs the step's metrics after on_step_end, so the
                # commit is queued once they are in (on_log) or before the next step.
                snapshot = self._snapshot(model)
                if self.publisher is not None:
                    self._due = (state.global_step, snapshot, model)

    def on_log(self, args, state, control, **kwargs):
        self._publish_due(state)

    def on_step_begin(self, args, state, control, **kwargs):
        self._publish_due(state)

    def on_save(self, args, state, control, **kwargs):
        if not self.commit_on_save or self.publisher is None:
            return
        self._publish_due(state)
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if checkpoint.is_dir():
            # committed before training goes on: a later save may rotate the directory away
            self.publisher.publish(message=f"checkpoint {state.global_step}", metadata=self._metadata(state),
                                   directory=checkpoint, exclude=CHECKPOINT_EXCLUDES, wait=True)

    def on_train_end(self, args, state, control, **kwargs):
        self._publish_due(state)
        if self.publisher is not None:
            if not self.publisher.close(self.flush_timeout):
                self.unpushed = True

    # -- work --------------------------------------------------------------------------------
    def _snapshot(self, model):
        """A host copy of the weights that train (frozen ones, a PEFT base, are referenced).
        Sharded weights are gathered with every rank taking part; only rank 0 gets them."""
        t = time.perf_counter()
        if _is_multi_rank() and _is_sharded(model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            self.pauses.append(time.perf_counter() - t)
            return (full, []) if self.publisher is not None else None  # already rank 0's own copy
        if self.publisher is None:  # another rank of an unsharded run: rank 0 reads its own copy
            return None
        target = _unwrap(model)
        frozen = frozenset(n for n, p in target.named_parameters(remove_duplicate=False) if not p.requires_grad)
        snapshot = self.publisher.snapshot(target.state_dict(), frozen)
        self.pauses.append(time.perf_counter() - t)
        return snapshot

    def _metadata(self, state, step: int | None = None) -> dict:
        step = state.global_step if step is None else step
        return {"step": step, "epoch": state.epoch, "metrics": _latest_metrics(state)}

    def _publish_due(self, state) -> None:
        due, self._due = self._due, None
        if due is not None:
            step, snapshot, model = due
            self._publish(f"step {step}", state, snapshot, model, step)

    def _publish(self, message, state, snapshot, model, step) -> None:
        processing_class = self._processing_class

        def write(snap, directory):
            save_files(model, processing_class, snap, directory)

        self.publisher.publish(message=message, metadata=self._metadata(state, step), snapshot=snapshot,
                               write_files=write)


def _branch_name(args, existing=(), resuming: bool = False) -> str:
    """``run/<run name or output dir name>``; a name taken by an earlier run gets -2, -3, ...
    (unless this run resumes from a checkpoint: then it continues its branch)."""
    from ..errors import InvalidRefName
    from ..store.refs import check_ref_name

    raw = getattr(args, "run_name", None) or Path(args.output_dir).name or "run"
    name = "".join(c if c.isalnum() or c in "-_./" else "-" for c in str(raw)).strip("-./") or "run"
    try:
        base = check_ref_name(f"run/{name}")
    except InvalidRefName:
        base = "run/train"
    if resuming or base not in existing:
        return base
    n = 2
    while f"{base}-{n}" in existing:
        n += 1
    return f"{base}-{n}"
