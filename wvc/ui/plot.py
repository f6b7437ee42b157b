"""``wvc plot changes|metrics|storage``: the pictures of ``wvc ui`` written to a file (SVG,
or PNG through cairosvg when it is installed), for reports and CI artifacts. The numbers
come from ui/data.py, the same as the page's; ``--json`` gives them."""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidArgument
from ..fsutil import atomic_write
from . import data, svg

KINDS = ("changes", "metrics", "storage")


def stack(parts: list[tuple[str, str]]) -> str:
    """One SVG of several pictures, one under the other, each with its title."""
    width, y, inner = 0, 0, []
    for title, picture in parts:
        w = int(picture.split('width="', 1)[1].split('"', 1)[0])
        h = int(picture.split('height="', 1)[1].split('"', 1)[0])
        body = picture.split(">", 1)[1].rsplit("</svg>", 1)[0]
        inner.append(f'<text x="8" y="{y + 16}" font-size="13">{svg._e(title)}</text>'
                     f'<g transform="translate(0,{y + 24})">{body}</g>')
        width, y = max(width, w), y + h + 32
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" {svg.FONT}>'
            f'<rect width="100%" height="100%" fill="white"/>{"".join(inner)}</svg>')


def picture(repo, kind: str, rev_range: str | None = None, *, metric: str = "rel_l2", branches=None,
            limit: int = data.DEFAULT_LIMIT, progress=None) -> tuple[str, dict]:
    """(the SVG, the numbers it shows)."""
    if kind == "changes":
        commits = data.commits_of(repo, rev_range, limit)
        m = data.change_map(repo, commits, metric, progress)
        names = [r["tensor"] if len({x["file"] for x in m["rows"]}) == 1 else f'{r["file"]}:{r["tensor"]}'
                 for r in m["rows"]]
        cols = [str(c["step"]) if c["step"] is not None else c["commit"][:7] for c in m["columns"]]
        for c in m["cells"]:
            c["title"] = f'{m["rows"][c["row"]]["tensor"]} @ {m["columns"][c["col"]]["commit"][:10]}: {svg.fmt(c["value"])}'
        return stack([(f'{m["metric_label"]} against the first parent', svg.heatmap(names, cols, m["cells"]))]), m
    if kind == "metrics":
        m = data.metrics(repo, branches)
        parts = [(key, svg.lines(series, "step", key)) for key, series in sorted(m["series"].items())]
        if not parts:
            raise InvalidArgument("no numeric metadata on these branches: nothing to plot")
        return stack(parts), m
    if kind == "storage":
        commits = data.commits_of(repo, rev_range, limit)
        s = data.storage(repo, commits)
        cum = {"stored": [[i, r["cumulative_stored"], r["commit"]] for i, r in enumerate(s["commits"])],
               "full copies": [[i, r["cumulative_full"], r["commit"]] for i, r in enumerate(s["commits"])]}
        per = [(f'{r["commit"][:7]} {r["message"][:30]}', r["stored_bytes"] or 0) for r in s["commits"]]
        return stack([("cumulative bytes: stored against full copies", svg.lines(cum, "commit", "bytes")),
                      ("stored bytes per commit", svg.bars(per[-60:], "B"))]), s
    raise InvalidArgument(f"unknown plot {kind!r}: one of {', '.join(KINDS)}")


def write(text: str, out: Path) -> None:
    """The SVG to ``out`` (.svg), or rendered to PNG (.png, needs cairosvg); atomically."""
    suffix = out.suffix.lower()
    if suffix == ".svg":
        payload = text.encode("utf-8")
    elif suffix == ".png":
        try:
            import cairosvg
        except (ImportError, OSError) as exc:  # OSError: cairosvg without the cairo library
            raise InvalidArgument("PNG output needs cairosvg and the cairo library (pip install 'wvc[plot]'); "
                                  "or write an .svg") from exc
        payload = cairosvg.svg2png(bytestring=text.encode("utf-8"))
    else:
        raise InvalidArgument(f"{out}: write a .svg or a .png")
    atomic_write(out, payload)
