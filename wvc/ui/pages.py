"""The views of ``wvc ui``, as HTML pages around server-drawn SVG (ui/svg.py): history,
change map (and one tensor's change), metrics, storage, compare. Read-only."""

from __future__ import annotations

from html import escape
from urllib.parse import urlencode

from . import data, svg

STYLE = """body{font-family:system-ui,sans-serif;margin:0;color:#222}nav{background:#1b2a41;padding:8px 16px}
nav a{color:#fff;margin-right:18px;text-decoration:none}main{padding:12px 16px}table{border-collapse:collapse;font-size:12px}
td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f3f3f3}.ref{background:#e8f0fe;
border-radius:3px;padding:0 4px;margin-right:3px;font-size:11px}.num{text-align:right}.muted{color:#777}
form{margin:8px 0}.error{color:#b00020}"""
VIEWS = [("History", "/"), ("Change map", "/changes"), ("Metrics", "/metrics"), ("Storage", "/storage"),
         ("Compare", "/compare")]


def _e(v) -> str:
    return escape(str(v), quote=True)


def _size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def page(title: str, body: str, repo_name: str) -> str:
    nav = "".join(f'<a href="{href}">{name}</a>' for name, href in VIEWS)
    return (f'<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>{_e(title)} - wvc {_e(repo_name)}</title>'
            f'<style>{STYLE}</style></head><body><nav>{nav}<span style="color:#9ab">{_e(repo_name)}</span></nav>'
            f'<main><h2>{_e(title)}</h2>{body}</main></body></html>')


def history_view(repo, q) -> tuple[str, str]:
    h = data.history(repo)
    rows = []
    for c in h["commits"]:
        refs = "".join(f'<span class="ref">{_e(r)}</span>' for r in c["refs"])
        meta = ", ".join(f"{_e(k)}={_e(v)}" for k, v in list(c["metadata"].items())[:6])
        rows.append(f'<tr data-commit="{c["commit"]}"><td><code>{c["commit"][:10]}</code></td><td>{refs}{_e(c["message"])}</td>'
                    f'<td class="muted">{meta}</td><td class="num">{_size(c["logical_bytes"])}</td>'
                    f'<td class="num">{_size(c["stored_bytes"])}</td>'
                    f'<td>{" ".join("<code>" + p[:7] + "</code>" for p in c["parents"])}</td></tr>')
    body = (f'<p>HEAD: {_e(h["head"] or "detached")}; {len(h["refs"])} refs (branches, tags, remote-tracking).</p>'
            + svg.graph(h["commits"])
            + '<h3>Commits</h3><table><tr><th>commit</th><th>message</th>'
            f'<th>metadata</th><th>size</th><th>stored</th><th>parents</th></tr>{"".join(rows)}</table>')
    return "History", body


def _rev_form(q, fields: dict) -> str:
    inputs = "".join(f'{_e(label)} <input name="{_e(k)}" value="{_e(q.get(k, [v])[0])}" size="14"> '
                     for k, (label, v) in fields.items())
    return f'<form method="get">{inputs}<button>show</button></form>'


def changes_view(repo, q) -> tuple[str, str]:
    rev = q.get("rev", ["HEAD"])[0]
    metric = q.get("metric", ["rel_l2"])[0]
    limit = int(q.get("limit", [str(data.DEFAULT_LIMIT)])[0])
    commits = data.commits_of(repo, rev, limit)
    m = data.change_map(repo, commits, metric, compute=False)
    names = [f'{r["file"]}:{r["tensor"]}' if len({x["file"] for x in m["rows"]}) > 1 else r["tensor"] for r in m["rows"]]
    cols = [str(c["step"]) if c["step"] is not None else c["commit"][:7] for c in m["columns"]]
    for c in m["cells"]:
        col, row = m["columns"][c["col"]], m["rows"][c["row"]]
        ch = c.get("change") or {}
        c["title"] = (f'{row["tensor"]} @ {col["commit"][:10]}' + (f' step {col["step"]}' if col["step"] is not None else "")
                      + f': {c["status"]}; rel L2 {svg.fmt(ch.get("rel_l2"))}, changed {svg.fmt(ch.get("changed"))} of '
                      f'{svg.fmt(ch.get("numel"))}, max |delta| {svg.fmt(ch.get("max_abs_delta"))}, '
                      f'max ULPs {svg.fmt(ch.get("max_ulps"))}')

    def link(c):
        row, col = m["rows"][c["row"]], m["columns"][c["col"]]
        return "/tensor?" + urlencode({"commit": col["commit"], "file": row["file"], "tensor": row["tensor"]})

    switch = " | ".join(f'<a href="/changes?{urlencode({"rev": rev, "metric": k, "limit": limit})}">{_e(v)}</a>'
                        for k, v in data.METRICS.items())
    body = (_rev_form(q, {"rev": ("revision or A..B", "HEAD"), "limit": ("last", str(data.DEFAULT_LIMIT))})
            + f'<p>Colour: {_e(m["metric_label"])} against the first parent (white: unchanged). {switch}</p>'
            + svg.heatmap(names, cols, m["cells"], link))
    return "Change map", body


def tensor_view(repo, q) -> tuple[str, str]:
    d = data.tensor_detail(repo, q["commit"][0], q["file"][0], q["tensor"][0])
    hist = [(f'>= {h["ulps_from"]} ULP', h["count"]) for h in d["histogram"]]
    chunks = [(f'chunk {i}', c["changed_fraction"]) for i, c in enumerate(d["chunks"])]
    body = (f'<p><code>{_e(d["tensor"])}</code> in {_e(d["file"])} at <code>{d["commit"][:10]}</code>: '
            f'{_e(d["dtype"])} {_e(d["shape"])}. {_e(d.get("note", ""))}</p>'
            f'<h3>Per-element change, in units of last place</h3>{svg.bars(hist, "elements")}'
            f'<h3>Fraction of elements changed, per chunk</h3>{svg.bars(chunks)}')
    return "Tensor change", body


def metrics_view(repo, q) -> tuple[str, str]:
    branches = q.get("branch") or None
    m = data.metrics(repo, branches)
    picks = " ".join(f'<label><input type="checkbox" name="branch" value="{_e(b)}"'
                     f'{" checked" if b in m["branches"] else ""}>{_e(b)}</label>' for b in sorted(repo.branches()))
    parts = [f'<form method="get">{picks} <button>show</button></form>']
    if not m["series"]:
        parts.append('<p class="muted">No numeric metadata on these branches (commit with --meta loss=... or the '
                     'Trainer callback).</p>')
    for key, per_branch in sorted(m["series"].items()):
        parts.append(f'<h3>{_e(key)}</h3>' + svg.lines(per_branch, "step", key))
    return "Metrics", "".join(parts)


def storage_view(repo, q) -> tuple[str, str]:
    rev = q.get("rev", ["HEAD"])[0]
    commits = data.commits_of(repo, rev)
    s = data.storage(repo, commits, compute=False)
    cum = {"stored": [[i, r["cumulative_stored"], r["commit"]] for i, r in enumerate(s["commits"])],
           "full copies": [[i, r["cumulative_full"], r["commit"]] for i, r in enumerate(s["commits"])]}
    per_commit = [(f'{r["commit"][:7]} {r["message"][:30]}', r["stored_bytes"] or 0) for r in s["commits"]]
    top = list(s["per_tensor"].items())[:40]
    remotes = "".join(f'<li>{_e(name)}: ' + ", ".join(f'{_e(b)} at <code>{t[:10]}</code>' for b, t in branches.items())
                      + "</li>" for name, branches in s["remotes"].items()) or "<li class='muted'>no remote-tracking branches</li>"
    body = (_rev_form(q, {"rev": ("revision or A..B", "HEAD")})
            + "<h3>Cumulative bytes: stored against full copies</h3>" + svg.lines(cum, "commit", "bytes")
            + "<h3>Stored bytes per commit</h3>" + svg.bars(per_commit[-60:], "B")
            + "<h3>Stored bytes per tensor (these commits)</h3>" + svg.bars(top, "B")
            + f"<h3>Remotes</h3><ul>{remotes}</ul>")
    return "Storage", body


def compare_view(repo, q) -> tuple[str, str]:
    a, b = q.get("a", ["HEAD~1"])[0], q.get("b", ["HEAD"])[0]
    c = data.compare(repo, a, b)
    key = q.get("sort", ["rel_l2"])[0]
    tensors = sorted(c["diff"]["tensors"], key=lambda t: (t.get(key) is None, -(t.get(key) or 0)))
    cols = ["file", "name", "status", "numel", "changed", "max_abs_delta", "max_ulps", "rel_l2", "stored_bytes"]
    head = "".join(f'<th><a href="/compare?{urlencode({"a": a, "b": b, "sort": k})}">{k}</a></th>' for k in cols)
    rows = "".join("<tr>" + "".join(f'<td data-field="{k}">{_e(svg.fmt(t.get(k)))}</td>' for k in cols) + "</tr>"
                   for t in tensors)
    body = (_rev_form(q, {"a": ("from", "HEAD~1"), "b": ("to", "HEAD")})
            + f'<p><code>{c["a"][:10]}</code> to <code>{c["b"][:10]}</code>: {len(tensors)} tensors changed.</p>'
            + "<h3>Relative L2 change per layer</h3>" + svg.bars(list(c["layers"].items()))
            + f"<table><tr>{head}</tr>{rows}</table>")
    return "Compare", body


ROUTES = {"/": history_view, "/changes": changes_view, "/tensor": tensor_view, "/metrics": metrics_view,
          "/storage": storage_view, "/compare": compare_view}
