"""At ``prune --remote``: which chunks of the kept versions the remote takes as the local store
holds them.

A local prune re-encodes a kept version's chunk whose delta chain ran through a pruned version's
chunk onto a kept base (store/prune_plan.py). The remote's copy of that chunk still runs through
the pruned versions' chunks, which then all stay: over 200 syncs ``keep="last=4,every=10"`` left
a run's remote at 0.93x of keeping everything, though a 10-step delta costs a third of its ten
steps (issue 65). Uploading the local payload in place of the remote's frees them.

A payload is valid where its base is the chunk it was coded against and, for a step coder's
(``Method.uses_context``), its base's base is the context it was coded in. The plan starts
from every chunk the kept versions need whose local row differs from the remote's (base or
method) and drops candidates until every chunk live under the new bases holds that (a fixed
point: candidates only go, so it ends; with none left the remote stays as it was). The local
store keeps the same rule for itself (a step payload whose base was rebased is re-encoded
without a context, and no later commit codes a step over a rebased chunk: chunk_writer.py),
so in practice only what must stay as it is (``keep_as_is``) costs a candidate its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..codec.container import Method
from ..store.chains import close_over_bases


@dataclass(frozen=True)
class Rep:
    """How a store holds a chunk: the chunk its payload is a delta against, its method, and
    the payload's size (not compared: the same base and method is the same representation)."""
    base: str | None
    method: int
    length: int = field(default=0, compare=False)


def _uses_context(method: int) -> bool:
    try:
        return Method(method).uses_context
    except ValueError:  # (a method this wvc does not know: assume the worst)
        return True


def stored_bytes(live: set[str], taken: dict[str, Rep], remote_rep) -> int:
    """What the remote's packs hold of ``live`` with ``taken`` uploaded in place of its own."""
    total = 0
    for oid in live:
        rep = taken.get(oid) or remote_rep(oid)
        total += rep.length if rep is not None else 0
    return total


def plan(needed: set[str], remote_rep: Callable[[str], Rep | None], local_rep: Callable[[str], Rep | None],
         keep_as_is: set[str] = frozenset()) -> tuple[dict[str, Rep], set[str]]:
    """(chunk id -> the local Rep the remote takes for it, the chunks live after: ``needed``
    closed over the new bases). ``remote_rep`` / ``local_rep``: a chunk's row in the
    remote's packs / the local packs, or None (not there: a base model's chunk is in neither).
    ``keep_as_is``: chunks whose remote payload must stay as it is."""
    taken: dict[str, Rep] = {}

    def candidate_base(oid: str) -> str | None:  # (asked once a chunk: the local row where it differs)
        mine, theirs = local_rep(oid), remote_rep(oid)
        if mine is not None and mine != theirs and oid not in keep_as_is:
            taken[oid] = mine
            return mine.base
        return theirs.base if theirs is not None else None

    close_over_bases(set(needed), candidate_base)

    def base_now(oid: str) -> str | None:
        rep = taken.get(oid) or remote_rep(oid)
        return rep.base if rep is not None else None

    def base_of(rep_of, oid: str | None) -> str | None:
        rep = rep_of(oid) if oid is not None else None
        return rep.base if rep is not None else None

    while True:
        live = close_over_bases(set(needed), base_now)
        drop: set[str] = set()
        for oid in live:
            if oid in taken:
                rep, context = taken[oid], base_of(local_rep, taken[oid].base)
            else:
                rep = remote_rep(oid)
                if rep is None:  # on neither side's packs: a base model's; in a local pack only: must go up
                    if local_rep(oid) is not None:
                        drop |= {o for o, r in taken.items() if r.base == oid}
                    continue
                context = base_of(remote_rep, rep.base)
            if _uses_context(rep.method) and base_now(rep.base) != context:
                drop.add(oid if oid in taken else rep.base)  # (not taken: its base was, onto another base)
        drop &= taken.keys()
        if not drop:
            return taken, live
        for oid in drop:
            del taken[oid]
