"""Which versions of a run keep their weights (``wvc prune``'s policy), and why.

A version is kept if any rule keeps it; each rule that keeps it is a reason (restic's
``forget`` shows its reasons the same way), so a user can see why a version survived a prune
before running it (``wvc prune --dry-run --json``). The prune itself adds the reasons no
policy can take away (a ref's commit, a fork point, the base model's root: ``ops/prune.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .versions import finite_number


@dataclass(frozen=True)
class KeepPolicy:
    """Which versions of a run keep their weights. A version is kept if any rule keeps it;
    a branch's tip, every commit a ref or HEAD points at, where another branch leaves the
    run (a merge's base) and a base model's root always are."""

    last: int = 0  # the newest ``last`` versions
    every: int = 0  # versions whose step (metadata "step", else position in the run from 0) is a multiple
    tagged: bool = False  # versions a tag points at
    best: tuple[str, ...] = ()  # "METRIC" or "METRIC:min|max" (default min): the best version by each

    @classmethod
    def of(cls, keep) -> "KeepPolicy":
        """A policy from a KeepPolicy, a dict of its fields, or a string such as
        ``"last=10,every=100,tagged,best=eval_loss:min"`` (the Publisher's ``keep=``)."""
        if isinstance(keep, KeepPolicy):
            return keep.checked()
        if isinstance(keep, str):
            fields: dict = {}
            for part in filter(None, (p.strip() for p in keep.split(","))):
                key, eq, value = part.partition("=")
                if key == "tagged" and not eq:
                    fields["tagged"] = True
                elif key in ("last", "every") and eq and value.isdigit():
                    fields[key] = int(value)
                elif key == "best" and value:
                    fields["best"] = fields.get("best", ()) + (value,)
                else:
                    raise InvalidArgument(f"keep policy: {part!r} is not last=K, every=N, tagged or best=METRIC[:min|max]")
            keep = fields
        if isinstance(keep, dict):
            unknown = set(keep) - {"last", "every", "tagged", "best"}
            if unknown:
                raise InvalidArgument(f"keep policy: unknown rule {sorted(unknown)[0]!r}")
            best = keep.get("best", ())
            return cls(int(keep.get("last", 0)), int(keep.get("every", 0)), bool(keep.get("tagged", False)),
                       (best,) if isinstance(best, str) else tuple(best)).checked()
        raise InvalidArgument(f"keep policy: expected a string, a dict or a KeepPolicy, not {type(keep).__name__}")

    def checked(self) -> "KeepPolicy":
        if self.last < 0 or self.every < 0:
            raise InvalidArgument("keep policy: --keep-last and --keep-every take a count of at least 1")
        if not (self.last or self.every or self.tagged or self.best):
            raise InvalidArgument("keep policy: say what to keep (--keep-last, --keep-every, --keep-tagged, --keep-best)")
        for spec in self.best:
            metric, _, direction = spec.partition(":")
            if not metric or direction not in ("", "min", "max"):
                raise InvalidArgument(f"keep policy: --keep-best {spec!r} is not METRIC[:min|max]")
        return self

    def reasons(self, run: list[str], metadata: dict[str, dict], tagged: set[str]) -> dict[str, list[str]]:
        """Those of ``run`` (commit ids, oldest first) this policy keeps, each with the rules
        that keep it ("last 10", "every 100", "tagged", "best eval_loss (min)")."""
        out: dict[str, list[str]] = {}

        def keep(commit: str, why: str) -> None:
            out.setdefault(commit, []).append(why)

        if self.last:
            for c in run[len(run) - self.last:]:
                keep(c, f"last {self.last}")
        if self.every:
            for i, c in enumerate(run):
                if _step(metadata[c], i) % self.every == 0:
                    keep(c, f"every {self.every}")
        if self.tagged:
            for c in run:
                if c in tagged:
                    keep(c, "tagged")
        for spec in self.best:
            metric, _, direction = spec.partition(":")
            scored = [(v, i, c) for i, c in enumerate(run) if (v := metric_value(metadata[c], metric)) is not None]
            if scored:
                best = max(scored) if direction == "max" else min(scored, key=lambda s: (s[0], -s[1]))
                keep(best[2], f"best {metric} ({direction or 'min'})")
        return out

    def kept(self, run: list[str], metadata: dict[str, dict], tagged: set[str]) -> set[str]:
        """Those of ``run`` (commit ids, oldest first) this policy keeps."""
        return set(self.reasons(run, metadata, tagged))


def _step(metadata: dict, position: int) -> int:
    step = metadata.get("step")
    return step if type(step) is int and step >= 0 else position


def metric_value(metadata: dict, metric: str) -> float | None:
    """A commit's value of ``metric``: metadata[metric], else metadata["metrics"][metric]
    (the Trainer callback's layout); only finite numbers count."""
    value = metadata.get(metric)
    if value is None and isinstance(metadata.get("metrics"), dict):
        value = metadata["metrics"].get(metric)
    return finite_number(value)
