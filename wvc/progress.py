"""Progress reporting: the API takes a Progress; the CLI passes one that draws a bar."""

from __future__ import annotations


class Progress:
    """Does nothing; subclasses draw. ``start`` may be called again for a new phase.
    ``unit``: what ``total`` counts; bytes unless a phase says otherwise ("files", "packs")."""

    def start(self, total: int, label: str, unit: str = "bytes") -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


NULL = Progress()
