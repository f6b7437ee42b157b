"""Delta chains: the one resolver every reader uses (local store, fetch verification, lazy
fetches, remote views).

A chunk stored as a delta names its base; the base may be a delta too. Resolving walks
those links iteratively (a chain of any depth is one loop, never a recursion), refuses a
chain that comes back to an object it has passed (a cycle, which only a damaged or hostile
store can hold) and one longer than ``max_links``. Decoding then runs from the keyframe
down, holding two chunks at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from .. import ids
from ..errors import CorruptObject, MissingObject

# The longest chain wvc ever reads. ``init --max-chain`` accepts at most MAX_CHAIN_LIMIT,
# which makes chains of MAX_CHAIN_LIMIT + 1 links; a remote's objects are held to the same
# bound, whatever repository made them.
MAX_CHAIN_LIMIT = 1000
MAX_CHAIN_LINKS = MAX_CHAIN_LIMIT + 1


class Link(Protocol):
    id: str
    base: str | None


L = TypeVar("L", bound=Link)


def resolve_chain(object_id: str, lookup: Callable[[str], L | None], *, max_links: int = MAX_CHAIN_LINKS,
                  stop: Callable[[str], bool] | None = None, where: str = "the store") -> list[L]:
    """The links to decode for ``object_id``: itself first, its keyframe last.

    ``lookup`` gives an object's link or None (then MissingObject). ``stop(id)`` true ends
    the walk before that object (its bytes come from elsewhere, e.g. a cache): the last link
    returned then has that object as its base.
    """
    links: list[L] = []
    seen: set[str] = set()
    cursor: str | None = object_id
    while cursor is not None:
        if links and stop is not None and stop(cursor):
            break
        if cursor in seen:
            raise CorruptObject(f"object {ids.short(object_id)} in {where} has a cyclic delta chain")
        if len(links) >= max_links:
            raise CorruptObject(f"object {ids.short(object_id)} in {where} has a delta chain deeper than "
                                f"{max_links - 1} (the most wvc reads)")
        seen.add(cursor)
        link = lookup(cursor)
        if link is None:
            raise MissingObject(f"object {ids.short(cursor)} is missing from {where}")
        links.append(link)
        cursor = link.base
    return links
