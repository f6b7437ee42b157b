"""Pictures as SVG text, drawn on the server: no JavaScript, no chart library, nothing
fetched; hovering shows each mark's numbers (``<title>``), clicking a heatmap cell follows
its link. Every mark carries its numbers in ``data-*`` attributes (tests read them). Every
string from the repository is escaped."""

from __future__ import annotations

import math
from html import escape

FONT = 'font-family="system-ui, sans-serif" font-size="11"'
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def _e(value) -> str:
    return escape(str(value), quote=True)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _short(v: float) -> str:
    """An axis tick: 1.2k, 3.4M, 5.6G for large values."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(v) >= limit:
            return f"{v / limit:.3g}{suffix}"
    return fmt(v)


def colour(value: float | None, lo: float, hi: float) -> str:
    """White (no change) to dark blue on a log scale between ``lo`` and ``hi``; grey: no
    number (a dtype or shape change)."""
    if value is None:
        return "#cccccc"
    if value <= 0:
        return "#ffffff"
    t = 1.0 if hi <= lo else (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    t = min(1.0, max(0.0, t))
    r, g, b = (int(round(255 + (c - 255) * (0.15 + 0.85 * t))) for c in (8, 48, 107))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(rows: list[str], columns: list[str], cells: list[dict], link=None, cell: int = 10) -> str:
    """``cells``: {row, col, value, title}; ``link(cell)``: where clicking it goes. Cells are
    ``cell`` high and as wide as 800 pixels allow (10 to 40); a legend shows the scale."""
    cw = max(cell, min(40, 800 // max(1, len(columns))))
    label_w = min(420, 7 * max((len(r) for r in rows), default=4) + 10)
    top = 60
    width, height = max(label_w + cw * len(columns) + 10, label_w + 260), top + cell * len(rows)
    positive = [c["value"] for c in cells if c["value"] is not None and c["value"] > 0]
    lo, hi = (min(positive), max(positive)) if positive else (1.0, 1.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" {FONT}>']
    for k in range(10):  # the legend: white (unchanged), then lo .. hi on a log scale
        v = lo * (hi / lo) ** (k / 9) if hi > lo else hi
        out.append(f'<rect x="{label_w + 20 * k}" y="4" width="20" height="10" fill="{colour(v, lo, hi)}" stroke="#ccc"/>')
    out.append(f'<text x="{label_w - 4}" y="13" text-anchor="end">{fmt(lo)}</text>'
               f'<text x="{label_w + 204}" y="13">{fmt(hi)} (grey: no number)</text>')
    for i, name in enumerate(rows):
        out.append(f'<text x="{label_w - 4}" y="{top + i * cell + cell - 2}" text-anchor="end">{_e(name[-60:])}</text>')
    every = max(1, (len(columns) * 10) // (cw * 12) or 1)
    for j, name in enumerate(columns):
        if j % every == 0:
            x = label_w + j * cw + cw // 2
            out.append(f'<text x="{x}" y="{top - 4}" transform="rotate(-45 {x} {top - 4})">{_e(name)}</text>')
    for c in cells:
        x, y = label_w + c["col"] * cw, top + c["row"] * cell
        rect = (f'<rect x="{x}" y="{y}" width="{cw - 1}" height="{cell - 1}" fill="{colour(c["value"], lo, hi)}" '
                f'stroke="#eeeeee" data-row="{c["row"]}" data-col="{c["col"]}" data-value="{_e(fmt(c["value"]))}">'
                f'<title>{_e(c.get("title", ""))}</title></rect>')
        href = link(c) if link else None
        out.append(f'<a href="{_e(href)}">{rect}</a>' if href else rect)
    out.append("</svg>")
    return "".join(out)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * k / (n - 1) for k in range(n)]


def lines(series: dict[str, list], x_label: str = "step", y_label: str = "", width: int = 640,
          height: int = 280) -> str:
    """``series``: label -> [[x, y, title], ...]; one polyline and a point per value."""
    points = [p for s in series.values() for p in s]
    left, right, top, bottom = 90, 150, 20, 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="lines" width="{width}" height="{height}" {FONT}>']
    if not points:
        out.append(f'<text x="{left}" y="{height // 2}">no numeric metadata</text></svg>')
        return "".join(out)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + (abs(y0) or 1)

    def sx(x):
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y):
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    out.append(f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#444"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#444"/>')
    for t in _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{height - bottom + 14}" text-anchor="middle">{fmt(t)}</text>')
    for t in _ticks(y0, y1):
        out.append(f'<text x="{left - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_short(t)}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">{_e(x_label)}</text>')
    out.append(f'<text x="12" y="{top + (height - top - bottom) / 2}" transform="rotate(-90 12 '
               f'{top + (height - top - bottom) / 2})" text-anchor="middle">{_e(y_label)}</text>')
    for k, (label, pts) in enumerate(series.items()):
        colour_ = PALETTE[k % len(PALETTE)]
        pts = sorted(pts, key=lambda p: p[0])
        path = " ".join(f"{sx(p[0]):.1f},{sy(p[1]):.1f}" for p in pts)
        out.append(f'<polyline fill="none" stroke="{colour_}" stroke-width="1.5" points="{path}" '
                   f'data-series="{_e(label)}"/>')
        for p in pts:
            title = f"{label}: {y_label} {fmt(p[1])} at {x_label} {fmt(p[0])}" + (f" ({p[2][:12]})" if len(p) > 2 else "")
            out.append(f'<circle cx="{sx(p[0]):.1f}" cy="{sy(p[1]):.1f}" r="2.5" fill="{colour_}" '
                       f'data-series="{_e(label)}" data-x="{_e(p[0])}" data-y="{_e(p[1])}"><title>{_e(title)}</title></circle>')
        out.append(f'<rect x="{width - right + 10}" y="{top + 16 * k}" width="10" height="10" fill="{colour_}"/>'
                   f'<text x="{width - right + 24}" y="{top + 16 * k + 9}">{_e(label[:20])}</text>')
    out.append("</svg>")
    return "".join(out)


def bars(items: list[tuple[str, float]], unit: str = "", width: int = 640, bar: int = 14) -> str:
    """Horizontal bars: (label, value)."""
    label_w = min(360, 7 * max((len(k) for k, _ in items), default=4) + 10)
    height = 10 + bar * len(items)
    top = max((v for _, v in items), default=0) or 1
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="bars" width="{width}" height="{height}" {FONT}>']
    for i, (label, value) in enumerate(items):
        w = (width - label_w - 90) * (value / top if value else 0)
        y = 5 + i * bar
        out.append(f'<text x="{label_w - 4}" y="{y + bar - 4}" text-anchor="end">{_e(label[-55:])}</text>'
                   f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar - 3}" fill="{PALETTE[0]}" '
                   f'data-label="{_e(label)}" data-value="{_e(value)}"><title>{_e(label)}: {fmt(value)} {_e(unit)}</title></rect>'
                   f'<text x="{label_w + w + 4:.1f}" y="{y + bar - 4}">{fmt(value)} {_e(unit)}</text>')
    out.append("</svg>")
    return "".join(out)


def graph(commits: list[dict], row: int = 20) -> str:
    """The commit graph, newest first (as ``git log --graph``): a dot a commit in its lane,
    a line to each parent shown; beside it the id, the refs and the message."""
    lanes: list[str | None] = []
    place: dict[str, tuple[int, int]] = {}
    for i, c in enumerate(commits):
        lane = lanes.index(c["commit"]) if c["commit"] in lanes else None
        if lane is None:
            lane = lanes.index(None) if None in lanes else len(lanes)
            if lane == len(lanes):
                lanes.append(None)
        place[c["commit"]] = (lane, i)
        lanes = [None if x == c["commit"] else x for x in lanes]
        for k, p in enumerate(c["parents"]):
            if p in lanes:
                continue
            if k == 0:
                lanes[lane] = p
            else:
                free = lanes.index(None) if None in lanes else len(lanes)
                if free == len(lanes):
                    lanes.append(None)
                lanes[free] = p
    width_lanes = 16 * max(1, len(lanes)) + 10
    height = row * len(commits) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width_lanes + 900}" height="{height}" {FONT}>']

    def xy(lane, i):
        return 10 + 16 * lane, 10 + row * i

    for c in commits:
        x0, y0 = xy(*place[c["commit"]])
        for p in c["parents"]:
            if p in place:
                x1, y1 = xy(*place[p])
                out.append(f'<path d="M{x0},{y0} C{x0},{y0 + row / 2} {x1},{y1 - row / 2} {x1},{y1}" fill="none" '
                           f'stroke="{PALETTE[place[p][0] % len(PALETTE)]}" stroke-width="1.5"/>')
    for c in commits:
        lane, i = place[c["commit"]]
        x, y = xy(lane, i)
        refs = "".join(f" [{r}]" for r in c.get("refs", []))
        out.append(f'<circle cx="{x}" cy="{y}" r="4" fill="{PALETTE[lane % len(PALETTE)]}" data-commit="{c["commit"]}">'
                   f'<title>{_e(c["commit"])}</title></circle>'
                   f'<text x="{width_lanes}" y="{y + 4}"><tspan font-family="monospace">{c["commit"][:10]}</tspan>'
                   f'<tspan fill="#1a56db">{_e(refs)}</tspan> {_e(c.get("message", "")[:90])}</text>')
    out.append("</svg>")
    return "".join(out)
