"""The two anchor policies wvc used before the hierarchy (store/anchors.py), kept out of the
product for comparisons only: ``benchmarks/anchor_policy.py`` measures them against it and
tests/test_anchors.py checks what the hierarchy fixed. Each has ``choose_base``'s signature."""

from __future__ import annotations

from wvc.store.anchors import span
from wvc.store.rows import ObjectRow


def choose_base_nearest(chain: list[ObjectRow], positions: dict[str, int], max_chain: int) -> tuple[list[ObjectRow], int]:
    """The hierarchy before the jump, for comparisons (benchmarks/anchor_policy.py): at a
    full target, the first link further down with room, the positions counting on."""
    position = positions.get(chain[0].id, 0) + 1
    target = position - span(position)
    for k, link in enumerate(chain):
        at = positions.get(link.id, 0)
        if at <= target and link.depth < max_chain:
            suffix = chain[k:]
            if sum(r.length for r in suffix[:-1]) <= suffix[-1].length:
                return suffix, position
            break
        if link.id not in positions:
            break  # the root, and it is full
    return chain[-1:], 0  # the keyframe: the new version is a root


def choose_base_flat(chain: list[ObjectRow], positions: dict[str, int], max_chain: int) -> tuple[list[ObjectRow], int]:
    """The policy before the hierarchy, for comparisons (benchmarks/anchor_policy.py, the
    tests): every version against its parent, re-anchored to the keyframe at ``max_chain``
    links or when the chain's deltas outweigh its keyframe."""
    if chain[0].depth >= max_chain or sum(r.length for r in chain[:-1]) > chain[-1].length:
        return chain[-1:], 0
    return chain, 0
