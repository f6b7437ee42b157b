"""The two places wvc changes TRL's classes, and why. Both are for TRL's async GRPO (the
versions ``library_versions.py`` declares), installed once, on the first ``WvcWeightTransfer``
made in a process where TRL is installed, and only when its version is one wvc was tested with
(``require("trl")`` refuses another before anything here runs).

- ``AsyncGRPOTrainer.__init__``: TRL's weight-transfer protocol hands the transfer a stream of
  tensors and nothing else, but a wvc sync needs the trainer: the model the servers started
  from (to publish it once), the model version and global step each version records, and
  the rollout worker whose version it holds back. The transfer is built before the trainer,
  so a constructor argument cannot carry it; the trainer's ``__init__`` is extended to hand
  itself to the wvc transfer it was given (``WvcWeightTransfer.bind_trainer``). It used to be
  found by reading the callers' frames.
- ``AsyncRolloutWorker.update_model_version``: TRL bumps the rollout worker's version when
  ``send_weights`` returns; a background sync is loaded later, so the worker passes on at most
  the version the servers hold (TRL has no hook for it).
"""

from __future__ import annotations

import functools
import weakref

from .library_versions import require

_WANTS_TRAINER: "weakref.WeakSet" = weakref.WeakSet()  # transfers a trainer hands itself to
_HELD_BACK: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # TRL rollout worker -> its transfer
_INSTALLED: dict[str, object] = {}  # what was extended: "trainer", "rollout_worker" -> TRL's class


def hand_trainer_to(transfer) -> bool:
    """The AsyncGRPOTrainer built with ``transfer`` calls its ``bind_trainer(trainer)`` at the
    end of its ``__init__``. False where TRL is not installed (another loop: nothing to hook)."""
    require("trl", optional=True)
    try:
        from trl.experimental.async_grpo.async_grpo_trainer import AsyncGRPOTrainer
    except ImportError:
        return False
    if "trainer" not in _INSTALLED:
        original = AsyncGRPOTrainer.__init__

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            transfer = getattr(self, "weight_transfer", None)  # (set on the main process only)
            if transfer is not None and transfer in _WANTS_TRAINER:
                transfer.bind_trainer(self)

        AsyncGRPOTrainer.__init__ = __init__
        _INSTALLED["trainer"] = AsyncGRPOTrainer
    _WANTS_TRAINER.add(transfer)
    return True


def hold_rollout_versions(worker, transfer) -> bool:
    """TRL's rollout ``worker`` passes a version on through ``transfer._rollout_version``, which
    tells it at most what the servers hold. False for a worker of another kind. (Called at each
    sync, by a transfer whose making checked TRL's version: ``hand_trainer_to``.)"""
    try:
        from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker
    except ImportError:
        return False
    if not isinstance(worker, AsyncRolloutWorker):
        return False
    if "rollout_worker" not in _INSTALLED:
        original = AsyncRolloutWorker.update_model_version

        @functools.wraps(original)
        def update_model_version(self, model_version: int) -> None:
            held_by = _HELD_BACK.get(self)
            if held_by is None:
                return original(self, model_version)
            held_by._rollout_version(self, model_version, original)

        AsyncRolloutWorker.update_model_version = update_model_version
        _INSTALLED["rollout_worker"] = AsyncRolloutWorker
    _HELD_BACK[worker] = transfer
    return True
