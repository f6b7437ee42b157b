"""vLLM follows a wvc branch: the engine's weights move to each new commit in place, exactly.

- ``attach(llm, source, branch, at=commit)``: an in-process ``vllm.LLM`` (offline.py);
- the ``wvc`` weight-transfer backend of a vLLM server (``--weight-transfer-config
  '{"backend": "wvc"}'``, registered by the ``vllm.general_plugins`` entry point: plugin.py),
  driven through vLLM's own routes with commit ids (transfer.py);
- underneath, per worker: a follower's host copy (session.py) and the writes into vLLM's
  two weight layouts (engine_weights.py).

Nothing here imports vLLM until an engine is attached.
"""

__all__ = ["attach", "WorkerExtension"]


def __getattr__(name: str):
    if name in ("attach", "WorkerExtension", "AttachedEngine"):
        from . import offline

        return getattr(offline, name)
    raise AttributeError(f"module 'wvc.integrations.vllm' has no attribute {name!r}")
