"""An in-process vLLM engine (``vllm.LLM``) following a wvc branch.

    llm = LLM(model=checkout_dir, ...)
    engine = wvc.integrations.vllm.attach(llm, "hf://team/policy", "main", at=commit)
    engine.update()            # the branch's tip, applied in place; None if already there

Each of the engine's workers has a follower (session.py; the workers of a tensor-parallel
engine share one, with one host copy: server_group.py), reached through
``LLM.collective_rpc`` by method name (``wvc_attach``, ``wvc_update``, ``wvc_info``: the
plugin adds them to vLLM's worker wrapper in every process, so no function has to be
pickled across to worker processes, which vLLM refuses by default). ``WorkerExtension``
gives the same worker methods to those who drive workers by name (``LLM(worker_extension_cls="wvc.integrations.vllm.WorkerExtension")``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from ...errors import EngineUnusable, WvcError
from ...read.follower import Update

# each worker's follower, by worker: vLLM's worker is not ours to add attributes to, and the
# follower (with its host copy of the weights) goes when the worker does
_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class EngineUpdate(Update):
    """An Update as it went into the engine: ``applied`` (engine_weights.Applied.to_json):
    the tensors reloaded, patched sparse or dense, and the packed copies rebuilt."""

    applied: dict = field(default_factory=dict)


def _worker_of(obj):
    """The worker itself: ``collective_rpc`` calls a function with vLLM's worker wrapper, a
    method by name on the worker the wrapper holds (the extension's ``self``)."""
    return getattr(obj, "worker", None) or obj


def _weights_factory(worker):
    from .engine_weights import EngineWeights

    model, config = worker.model_runner.get_model(), worker.vllm_config
    return lambda names: EngineWeights(model, config, names)


def _attach(worker, source: str, branch: str, at: str | None) -> dict:
    from . import server_group
    from .session import EngineFollower

    config = worker.vllm_config.model_config
    session = EngineFollower(_weights_factory(worker), source, branch, at=at, model=config.model,
                             revision=config.revision, group=server_group.of_worker())
    if session.failed is not None:  # (the group's last worker raised it: the call's error)
        return {"commit": None}
    _SESSIONS[_worker_of(worker)] = session
    return session.info()


def _update(worker, rev: str | None, timeout: float | None) -> dict | None:
    session = _SESSIONS.get(_worker_of(worker))
    if session is None:
        raise WvcError("no wvc follower on this worker: attach first")
    up = session.update(rev, timeout)
    if up is None:
        return None
    out = up.to_json()
    out["applied"] = session.last_applied.to_json()
    return out


def _info(worker) -> dict:
    session = _SESSIONS.get(_worker_of(worker))
    return {"commit": None} if session is None else session.info()


ATTACH, UPDATE, INFO = WORKER_METHODS = ("wvc_attach", "wvc_update", "wvc_info")  # on vLLM's worker wrapper (plugin.py)


def add_worker_methods(wrapper_class) -> None:
    """``wvc_attach``, ``wvc_update`` and ``wvc_info`` on vLLM's worker wrapper, by name."""
    for name, method in zip(WORKER_METHODS, (WorkerExtension.wvc_attach, WorkerExtension.wvc_update,
                                             WorkerExtension.wvc_info)):
        if not hasattr(wrapper_class, name):
            setattr(wrapper_class, name, method)


class WorkerExtension:
    """Worker methods for ``LLM(worker_extension_cls=...)``: ``wvc_attach(source, branch, at)``,
    ``wvc_update(rev=None, timeout=None)``, ``wvc_info()``, each called on every worker with
    ``llm.collective_rpc("wvc_update", ...)``."""

    def wvc_attach(self, source: str, branch: str = "main", at: str | None = None) -> dict:
        return _attach(self, source, branch, at)

    def wvc_update(self, rev: str | None = None, timeout: float | None = None) -> dict | None:
        return _update(self, rev, timeout)

    def wvc_info(self) -> dict:
        return _info(self)


class AttachedEngine:
    """A ``vllm.LLM`` whose workers follow a branch (``attach``)."""

    def __init__(self, llm, source: str, branch: str = "main", at: str | None = None):
        self.llm, self.source, self.branch = llm, str(source), branch
        infos = llm.collective_rpc(ATTACH, args=(self.source, branch, at))
        self.commit: str | None = infos[0]["commit"]
        if self.commit is not None:
            self._set_version(self.commit)

    def update(self, rev: str | None = None, timeout: float | None = None) -> EngineUpdate | None:
        """Move every worker to ``rev`` (default: the branch's tip), waiting up to ``timeout``
        seconds for a new commit; the Update (its ``applied``: what went into the engine how),
        or None when nothing is new. On a failure the engine keeps the old version, or (when
        writing into the engine failed midway) raises EngineUnusable: restart it."""
        results = self.llm.collective_rpc(UPDATE, args=(rev, timeout))
        if all(r is None for r in results):
            return None
        commits = {None if r is None else r["commit"] for r in results}
        if len(commits) != 1:
            raise EngineUnusable(f"the engine's workers hold different versions ({sorted(map(str, commits))}): "
                                 f"restart it")
        first = results[0]
        applied = first.pop("applied")
        first.pop("changed_elements", None)
        up = EngineUpdate(**first, applied=applied)
        # (the prefix cache: reset by the plugin after every wvc_update, running requests included)
        self.commit = up.commit
        self._set_version(up.commit)
        return up

    def _set_version(self, commit: str) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        if engine is not None and hasattr(engine, "set_weight_version"):
            engine.set_weight_version(commit)  # what vLLM reports with each output

    def info(self) -> list[dict]:
        return self.llm.collective_rpc(INFO)


def attach(llm, source, branch: str = "main", *, at: str | None = None) -> AttachedEngine:
    """Make ``llm`` (a ``vllm.LLM``) follow ``branch`` of ``source`` (a repository path or a
    remote URL). ``at``: the commit the engine was started from (its checkout: checked chunk
    by chunk against the files it loaded), so that the first update downloads one step, not
    the model; without it the first update loads the whole version."""
    from ..library_versions import require

    require("vllm")
    return AttachedEngine(llm, source, branch, at)
