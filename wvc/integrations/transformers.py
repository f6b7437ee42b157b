"""``WvcCallback``: version every checkpoint of a transformers (or TRL) Trainer run.

    from wvc.integrations.transformers import WvcCallback
    trainer = Trainer(..., callbacks=[WvcCallback("runs/wvc", push_to="hf://team/model")])

On each checkpoint save it commits the checkpoint directory the Trainer just wrote (so a
commit is exactly what was saved; optimizer, scheduler and RNG state are left out), and
with ``every_n_steps`` it also commits ``model.state_dict()`` straight from memory between
saves. Commits go to a branch named after the run, carry the step, epoch and latest
metrics as metadata, and never move the repository's checked-out working tree.

With ``push_to``, a background thread pushes the branch after each commit: training never
waits on the network, a failed push is retried (with back-off) on the next commit or at
the end, and ``on_train_end`` flushes, so no commit is left behind. Push errors are
collected in ``callback.push_errors`` and logged, never raised into the training loop.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

from ..api import Repo

log = logging.getLogger("wvc")

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


class WvcCallback(TrainerCallback):
    def __init__(self, repo_path, *, every_n_steps: int | None = None, on_save: bool = True,
                 branch: str | None = None, push_to: str | None = None, remote: str = "origin",
                 device: str = "auto", max_push_attempts: int = 5, retry_seconds: float = 2.0,
                 flush_timeout: float = 30.0):
        self.repo_path = Path(repo_path)
        self.every_n_steps = every_n_steps
        self.commit_on_save = on_save
        self.branch = branch
        self.push_to = push_to
        self.remote = remote
        self.device = device
        self.max_push_attempts = max_push_attempts
        self.retry_seconds = retry_seconds  # back-off base: waits retry_seconds * 2**(attempt-1), at most 60 s
        # How long train() may wait at its end for the last push (an unreachable Hub must
        # not hold it through every retry); what is left is reported, `wvc push` sends it.
        self.flush_timeout = flush_timeout
        self.unpushed = False
        self.commits: list[dict] = []  # one per commit: id, step, seconds spent
        self.push_errors: list[str] = []
        self.repo: Repo | None = None
        self._queue: queue.Queue | None = None
        self._worker: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.repo = Repo.open(self.repo_path) if (self.repo_path / ".wvc").is_dir() else Repo.init(self.repo_path)
        # a run of its own unless told (or resuming): another run with the same output_dir
        # name must not become this one's parent
        self.branch = self.branch or _branch_name(args, self.repo.branches(),
                                                  resuming=bool(getattr(args, "resume_from_checkpoint", None)))
        if self.push_to:
            if self.remote not in self.repo.remotes():
                self.repo.remote_add(self.remote, self.push_to)
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._push_loop, name="wvc-push", daemon=True)
            self._worker.start()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every_n_steps and state.global_step % self.every_n_steps == 0 and self.repo is not None:
            if not (self.commit_on_save and control.should_save):  # the save will be committed
                # The Trainer logs this step's metrics after on_step_end: commit once they
                # are in (on_log), or before the weights next change (on_step_begin).
                self._due = (state.global_step, model)

    def on_log(self, args, state, control, **kwargs):
        self._commit_due(state)

    def on_step_begin(self, args, state, control, **kwargs):
        self._commit_due(state)

    def _commit_due(self, state) -> None:
        due, self._due = getattr(self, "_due", None), None
        if due is not None:
            step, model = due
            self._commit(f"step {step}", state, source=model.state_dict(), step=step)

    def on_save(self, args, state, control, **kwargs):
        if not self.commit_on_save or self.repo is None:
            return
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if checkpoint.is_dir():
            self._commit(f"checkpoint {state.global_step}", state, source=checkpoint)

    def on_train_end(self, args, state, control, **kwargs):
        self._commit_due(state)
        if self._queue is not None:
            self._queue.put(None)
            self._worker.join(timeout=self.flush_timeout)
            if self._worker.is_alive():  # still retrying: leave it (a daemon) and say so
                self.unpushed = True
                message = (f"not pushed within flush_timeout={self.flush_timeout:g} s: {self.branch} is committed in "
                           f"{self.repo_path}; `wvc push {self.remote} {self.branch}` there sends it")
                self.push_errors.append(message)
                log.warning("wvc: %s", message)
            self._queue = None

    # -- work --------------------------------------------------------------------------------
    def _commit(self, message: str, state, source, step: int | None = None) -> None:
        t = time.perf_counter()
        step = state.global_step if step is None else step
        metadata = {"step": step, "epoch": state.epoch, "metrics": _latest_metrics(state)}
        res = self.repo.commit(message, source=source, metadata=metadata, allow_empty=True, branch=self.branch,
                               device=self.device, exclude=CHECKPOINT_EXCLUDES)
        self.commits.append({"commit": res.commit, "step": step, "seconds": time.perf_counter() - t,
                             "stored_bytes": res.stored_bytes, "logical_bytes": res.logical_bytes})
        if self._queue is not None:
            self._queue.put(res.commit)

    def _push_loop(self) -> None:
        repo = Repo.open(self.repo_path)  # its own connection: never shares the trainer's
        pending, attempts, done = False, 0, False
        while not done or pending:
            try:
                wait = min(60.0, self.retry_seconds * 2.0 ** (attempts - 1)) if pending else None
                item = self._queue.get(timeout=wait)
                done = done or item is None
                pending = pending or item is not None
                while not self._queue.empty():  # coalesce: pushing the tip pushes every commit
                    item = self._queue.get_nowait()
                    done = done or item is None
                    pending = pending or item is not None
            except queue.Empty:
                pass
            if not pending:
                continue
            try:
                repo.push(self.remote, self.branch)
                pending, attempts = False, 0
            except Exception as exc:  # noqa: BLE001 - reported, retried, never raised into training
                attempts += 1
                self.push_errors.append(f"push attempt {attempts}: {exc}")
                log.warning("wvc: push to %s failed (%s); will retry", self.remote, exc)
                if done and attempts >= self.max_push_attempts:
                    log.error("wvc: giving up pushing %s after %d attempts", self.branch, attempts)
                    break
        repo.close()


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
