"""The README's figure, drawn from measured results (no number is typed in here).

    python -m benchmarks.figure

Reads ``benchmarks/results/results.md`` (stored bytes a version: wvc against a full copy, as
git-lfs and DVC keep each version, and against Xet-like content-defined-chunk dedup, as the
Hub stores it) and ``benchmarks/results/trl_sync.md`` (bytes a step to an RL server: wvc
against TRL's delta-sync patch), and writes ``docs/assets/wvc-sizes.svg``: plain SVG, no
script, no plotting library.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "docs" / "assets" / "wvc-sizes.svg"


def _rows(path: Path) -> list[dict]:
    """The first markdown table of ``path`` as dicts by column header."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def _number(text: str) -> float:
    return float(re.match(r"[\d.]+", text).group(0))


def storage_panel() -> tuple[str, list[tuple[str, float]]]:
    row = next(r for r in _rows(RESULTS / "results.md") if r["case"] == "minilm bf16 step 0 -> 200")
    raw = _number(row["raw MB"])
    return ("Stored for one version of a real bf16 fine-tune (MB; all-MiniLM-L6-v2, 200 AdamW steps)",
            [("full copy (git-lfs, DVC)", raw), ("Xet-like chunk dedup (the Hub)", raw / _number(row["CDC dedup (Xet-like)"])),
             ("wvc", raw / _number(row["wvc"]))])


def rl_panel() -> tuple[str, list[tuple[str, float]]]:
    row = next(r for r in _rows(RESULTS / "trl_sync.md") if r["model"].startswith("494M"))
    return ("Sent to each vLLM server a GRPO step (MB; 494M model, median of 20 syncs)",
            [("full weights (TRL's default)", _number(row["full model MB (TRL default)"])),
             ("TRL delta-sync patch", _number(row["delta-sync MB / sync (patch; with anchors)"])),
             ("wvc", _number(row["server download MB / sync"]))])


def svg(panels) -> str:
    width, bar_x, bar_w, row_h = 760, 250, 420, 26
    out, y = [], 10
    for title, bars in panels:
        y += 18
        out.append(f'<text x="10" y="{y}" font-weight="bold">{title}</text>')
        top = max(v for _, v in bars)
        for label, value in bars:
            y += row_h
            w = max(2.0, bar_w * value / top)
            colour = "#2b7bba" if label == "wvc" else "#b0b0b0"
            out.append(f'<text x="{bar_x - 8}" y="{y}" text-anchor="end">{label}</text>')
            out.append(f'<rect x="{bar_x}" y="{y - 14}" width="{w:.1f}" height="18" fill="{colour}"/>')
            out.append(f'<text x="{bar_x + w + 6:.1f}" y="{y}">{value:.1f}</text>')
        y += 20
    body = "\n".join(out)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" viewBox="0 0 {width} {y}" '
            f'font-family="sans-serif" font-size="13">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(svg([storage_panel(), rl_panel()]))
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
