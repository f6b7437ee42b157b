"""A stored chunk's row: where its payload is (a pack, or a base model's file) and what
decoding it needs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectRow:
    id: str
    pack: str
    offset: int
    length: int
    raw_size: int
    method: int
    base: str | None
    depth: int
    file: str | None = None  # set for an external object: its path in the base directory
    # a new row's anchor position (store/anchors.py), which insert_rows records; rows read
    # back leave it unset (ObjectStore.anchor_positions has it)
    position: int = 0
    # a new ULP_STEP row's step context as its writer read it (its base's base): the record
    # checks that the base still has that base (a prune may have re-encoded it meanwhile);
    # not stored, rows read back leave it unset
    context: str | None = None

    @property
    def external(self) -> bool:
        return self.file is not None
