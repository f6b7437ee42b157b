"""The workers of one vLLM model replica that share one follower (issue 65: one download, one
decode and one host copy per server, not per worker).

A tensor-parallel engine runs a worker process a shard, and every worker takes each wvc call
(``collective_rpc``) at the same point of its work loop: the tensor-parallel group's first
worker (the leader) fetches into a host copy in shared memory (shared_host.py), tells the
others what changed, and each worker writes its own shard from that copy through vLLM's
loaders. The group is vLLM's tensor-parallel group (within one pipeline stage and one
data-parallel replica: those take their calls on their own); its CPU (gloo) group carries
the messages. Workers on several nodes cannot map one host's memory: there each worker keeps
following on its own, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ... import errors

log = logging.getLogger(__name__)


@dataclass
class ServerGroup:
    """The workers that share one follower: this worker's ``rank`` of ``size`` (rank 0 leads),
    and the process group (gloo, host memory) their messages go over."""

    process_group: object  # torch.distributed.ProcessGroup
    rank: int
    size: int

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def broadcast(self, message=None):
        """The leader's ``message`` on every worker (pickled)."""
        import torch.distributed as dist

        box = [message]
        dist.broadcast_object_list(box, group=self.process_group, group_src=0)
        return box[0]

    def gather(self, value) -> list:
        """Every worker's ``value``, in rank order, on every worker."""
        import torch.distributed as dist

        out = [None] * self.size
        dist.all_gather_object(out, value, group=self.process_group)
        return out


def of_worker() -> ServerGroup | None:
    """This worker's group, or None when it follows alone: a single worker, or workers that
    do not all share this host's memory. A collective: every worker of the group calls it at
    the same point (an RPC every worker takes), and all get the same answer."""
    from vllm.distributed.parallel_state import get_tp_group, in_the_same_node_as, model_parallel_is_initialized

    if not model_parallel_is_initialized():
        return None
    tp = get_tp_group()
    if tp.world_size <= 1:
        return None
    if not all(in_the_same_node_as(tp.cpu_group, source_rank=0)):
        log.warning("wvc: this engine's tensor-parallel workers span nodes: each keeps a host copy of its own")
        return None
    return ServerGroup(tp.cpu_group, tp.rank_in_group, tp.world_size)


def described(exc: BaseException) -> tuple[str, str]:
    """An error as it crosses to the other workers: its wvc class's name and its message."""
    return type(exc).__name__, str(exc)


def rebuilt(description: tuple[str, str]) -> errors.WvcError:
    """The leader's error, raised on a worker that shares its follower (the same wvc class
    where it is one, else WvcError with the leader's words)."""
    name, message = description
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.WvcError):
        try:
            return cls(message)
        except TypeError:  # (a class whose constructor takes more than a message)
            pass
    return errors.WvcError(f"{name}: {message}")
