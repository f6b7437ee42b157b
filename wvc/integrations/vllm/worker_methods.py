"""The follower's methods on vLLM's worker wrapper, which the plugin calls on every worker by
name (``collective_rpc``: a server's engine core reaches workers by method name only; a
function would have to be pickled across, which vLLM refuses by default): the commit a
worker's engine holds, why it is unusable, and the prefetch of the next version. Each reads
the worker's wvc weight-transfer engine (transfer.py) when it has one. Light: the plugin adds
them in every vLLM process, beside offline.py's worker extension."""

from __future__ import annotations

from .shared_names import LOADED_COMMIT, PREFETCH, PREFETCHING, UNUSABLE


def _session(worker):
    return getattr(getattr(worker, "weight_transfer_engine", None), "session", None)


def _loaded_commit(worker) -> str | None:
    """The commit a worker's engine holds."""
    session = _session(worker)
    return None if session is None else session.commit


def _unusable(worker) -> str | None:
    """Why a worker's engine holds parts of two versions, or None."""
    session = _session(worker)
    return None if session is None else session.unusable


def _prefetch(worker, commit: str | None) -> None:
    """Start fetching ``commit`` into the worker's host copy while the engine serves (the
    update that follows only writes); nothing without a usable session (the update says why)."""
    session = _session(worker)
    if session is not None and session.unusable is None:
        session.prefetch(commit)


def _prefetching(worker) -> bool:
    session = _session(worker)
    return session is not None and session.prefetching


def add_follower_methods(wrapper_class) -> None:
    """The methods above on vLLM's worker wrapper, by their names (shared_names.py)."""
    for name, method in ((LOADED_COMMIT, _loaded_commit), (UNUSABLE, _unusable), (PREFETCH, _prefetch),
                         (PREFETCHING, _prefetching)):
        if not hasattr(wrapper_class, name):
            setattr(wrapper_class, name, method)
