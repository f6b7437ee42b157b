"""The anchor policy: which stored chunk a new version of a chunk is encoded against.

A chunk's versions along a run form a line: its keyframe (or any chunk whose position is not
known: a root) at position 0, then one version a step. The version at position ``s`` is
encoded against the version at ``s - ANCHOR_SPACING**L``, where ``ANCHOR_SPACING**L`` is the largest power of
the fanout dividing ``s`` (``L`` = 0: the previous version, a step delta). So three steps in
four are step deltas; every fourth is a delta against the version four back, every
sixteenth against the one sixteen back, and so on: a hierarchy of anchors, each a delta
against the anchor before it on its own level, like video codecs' reference frames.

Why: re-anchoring every ``max_chain`` steps to the keyframe stored the whole drift since the
keyframe, which grows with the run until it nears a keyframe's size (a 5,000-step run stored
20.5x its median step). Here the chain of ``s`` visits ``s`` with one digit (base ANCHOR_SPACING)
decremented at a time, so the base is always on the parent's chain, the depth is the digit
sum, and each anchor stores the drift over its own span, which stops growing with the run.
ULP_STEP's context (the base's own base) is then the previous anchor on the same level: the
drift over the span before, as correlated as a step with the step before.

The depth bound and the payload rule still hold. When the version at the target is already
``max_chain`` deep, the position jumps ahead to a multiple of a higher power of the fanout
whose target has room (:func:`choose_base`). When the base's chain's deltas outweigh its keyframe, the version is
encoded against the keyframe and becomes a root (position 0), as before. Positions are local
bookkeeping (the ``anchor_positions`` table), not part of any format: readers follow bases
whatever policy wrote them, and a fetched or re-encoded chunk has no position (a root).
Measured in docs/measurements.md ("Anchor hierarchy").
"""

from __future__ import annotations

from .rows import ObjectRow

ANCHOR_SPACING = 4


def span(position: int) -> int:
    """How many positions back the version at ``position`` (>= 1) is encoded against."""
    step = 1
    while position % (step * ANCHOR_SPACING) == 0:
        step *= ANCHOR_SPACING
    return step


def choose_base(chain: list[ObjectRow], positions: dict[str, int], max_chain: int) -> tuple[list[ObjectRow], int]:
    """The base's chain (a suffix of ``chain``) for a new version of the chunk whose chain
    is ``chain`` (the parent version first, its keyframe last), and the new version's
    position. ``positions``: the known positions of ``chain``'s links (a link without one
    is a root: position 0, and the chain ends there for the policy).

    The base is the link at the target position, one span back. When that link is already
    ``max_chain`` deep (or the chain has no link there), the position jumps ahead: to the
    next multiple of ANCHOR_SPACING, then of ANCHOR_SPACING**2, and so on, until its target is a link with
    room. The new version is then an anchor of a higher level (one delta over a longer span),
    and the versions after it count up from it with small digit sums: step deltas again.

    Why the jump: the depth is the position's digit sum (base ANCHOR_SPACING), which passes
    ``max_chain`` 8 for most positions past a few hundred steps. Taking the first link
    below the target with room instead (the policy before, ``choose_base_nearest`` in benchmarks/retired_anchor_policies.py) left the
    positions counting on, so the next versions were full too: in 5,000 steps, 72% of the
    versions were deltas over a span (17.6 steps on average) instead of a step, each stored
    bigger and sent to followers again as a step payload (remotes/step_record_writer.py). With the
    jump, 42% (6.5 steps on average); measured in docs/measurements.md ("Anchor jumps")."""
    position = positions.get(chain[0].id, 0) + 1
    at: dict[int, int] = {}  # position -> index in ``chain`` of the (topmost) link there
    for k, link in enumerate(chain):
        at.setdefault(positions.get(link.id, 0), k)
        if link.id not in positions:
            break  # the root
    power = 1
    while True:
        jumped = -(-position // power) * power
        target = jumped - span(jumped)
        k = at.get(target)
        if k is not None and chain[k].depth < max_chain:
            suffix = chain[k:]
            if sum(r.length for r in suffix[:-1]) <= suffix[-1].length:
                return suffix, jumped
            break
        if target == 0:
            break  # the root itself is full (a fetched root deeper than max_chain)
        power *= ANCHOR_SPACING
    return chain[-1:], 0  # the keyframe: the new version is a root
