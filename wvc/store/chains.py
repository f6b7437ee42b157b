"""Delta chains: the one resolver and the one decoder every reader uses (the local store,
fetch verification, lazy fetches, remote views and followers).

A chunk stored as a delta names its base; the base may be a delta too. Resolving walks
those links iteratively (a chain of any depth is one loop, never a recursion), refuses a
chain that comes back to an object it has passed (a cycle, which only a damaged or hostile
store can hold) and one longer than ``max_links``. Decoding (:func:`decode_links`) then
runs from the bottom link up, holding two chunks at a time: each link's base and the base's
own base (a ULP_STEP payload's step context). What differs between readers is a parameter:
where a payload comes from, what bytes are in hand below the chain, which links are
hash-checked, and what is kept of each result.
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


def close_over_bases(object_ids, base_of: Callable[[str], str | None]) -> set[str]:
    """``object_ids`` and every delta base their chains need, as far as ``base_of(id)``
    knows them (None: a keyframe, or an object it does not hold). The one closure gc's
    reachability and a remote's reachability share."""
    out = set(object_ids)
    frontier = list(out)
    while frontier:
        base = base_of(frontier.pop())
        if base is not None and base not in out:
            out.add(base)
            frontier.append(base)
    return out


def decode_verified(object_id: str, payload, raw_size: int, base, where: str, *, verify: bool = True,
                    context=None) -> bytes:
    """Decode one payload and check the result against its id: the only way bytes leave a pack.

    ``verify=False`` skips the hash check, for a link in the middle of a delta chain whose
    result is checked through the final object's (ObjectStore.decode_chain). ``context``:
    the base's own base (bytes, or a function returning them), which a ULP_STEP payload needs.
    """
    from .. import codec  # numpy and zstandard: not loaded by commands that decode nothing

    def attempt() -> bytes:
        try:
            raw = codec.decode(payload, raw_size, base, context=context)
        except CorruptObject as exc:
            raise CorruptObject(f"object {ids.short(object_id)} in {where}: {exc}") from exc
        if verify and ids.chunk_id(raw) != object_id:
            raise CorruptObject(f"object {ids.short(object_id)} in {where} fails its hash check")
        return raw

    try:
        return attempt()
    except CorruptObject:
        if not verify:  # (a link whose chain's final check decides)
            raise
        from ..codec import native  # before the object is called damaged: was it the system's zstd?

        again = native.retry_with_bundled(attempt)
        if again is None:
            raise
        return again


def decode_step_verified(object_id: str, payload, raw_size: int, base, positions, values,
                         where: str, width: int | None = None) -> tuple[bytes, ...] | None:
    """:func:`decode_verified` of a step payload whose context is given by where it differs
    from ``base`` (codec.decode_step_changes), with the elements the result changes from
    ``base`` (their int32 positions, old and new elements); None for a payload of another
    method, or of elements of other than ``width`` bytes where given."""
    from .. import codec

    return _changes_verified(object_id, where,
                             lambda: codec.decode_step_changes(payload, raw_size, base, positions, values, width))


def decode_sparse_verified(object_id: str, payload, raw_size: int, base, width: int,
                           where: str) -> tuple[bytes, ...] | None:
    """:func:`decode_step_verified` for a SPARSE payload of elements of ``width`` bytes (no
    context: it lists its changes, codec.decode_sparse_changes); None for a payload of another
    method or width."""
    from .. import codec

    return _changes_verified(object_id, where, lambda: codec.decode_sparse_changes(payload, raw_size, base, width))


def _changes_verified(object_id: str, where: str, decode) -> tuple[bytes, ...] | None:
    try:
        got = decode()
    except CorruptObject as exc:
        raise CorruptObject(f"object {ids.short(object_id)} in {where}: {exc}") from exc
    if got is not None and ids.chunk_id(got[0]) != object_id:
        raise CorruptObject(f"object {ids.short(object_id)} in {where} fails its hash check")
    return got


def decode_links(links, payload_of, *, below=None, context=None, where, verify=None, on_decoded=None):
    """Decode ``links`` (a chain, or its upper part, top first as :func:`resolve_chain` returns
    it) from the bottom up; returns (the top link's bytes, the bytes of its base or None).

    ``payload_of(link)``: the link's payload. ``below``: the bytes of the bottom link's base
    (None when the bottom link is a keyframe); ``context``: that base's own base (bytes, or a
    function giving them; a ULP_STEP payload's step context). ``where(link)`` (or a string)
    names the payload's place in errors. ``verify(k)``: whether the k-th link (0: the top) is
    hash-checked (default: every one). ``on_decoded(link, raw)`` hears each result (caches,
    depths, keyframes kept)."""
    raw, step_context = below, context
    for k in range(len(links) - 1, -1, -1):
        link = links[k]
        place = where if isinstance(where, str) else where(link)
        raw, step_context = decode_verified(link.id, payload_of(link), link.raw_size, raw, place,
                                            verify=True if verify is None else verify(k), context=step_context), raw
        if on_decoded is not None:
            on_decoded(link, raw)
    return raw, step_context
