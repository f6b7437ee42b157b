"""The command line: argument parsing and formatting only; every verb calls wvc.Repo.

Errors a user can cause print one line on stderr and exit 1; anything else prints one
line naming it as an internal error (set WVC_DEBUG=1 for the traceback). Nothing here
imports torch: ``--help``, ``log`` and ``status`` stay fast.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import sqlite3
import sys
import time
from pathlib import Path

import click

from . import settings
from .errors import WvcError
from .progress import NULL as NULL_PROGRESS, Progress

# numpy's OpenBLAS starts a thread per core that spins for a while; wvc does no linear
# algebra, and on 2 cores those threads took 14% of the CPU of a small model's commit.
# Nothing has imported numpy yet: the codec does, lazily, when a command needs it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def human(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def ratio_note(whole: int, actual: int, what: str = "stored") -> str:
    """" (12.3x smaller)" when ``actual`` is under ``whole``; otherwise the honest figure."""
    if not actual or not whole:
        return ""
    if actual < whole:
        if actual < 4096:  # "1258361.3x smaller" for a 73-byte commit says nothing: the bytes say it
            return ""
        return f" ({whole / actual:.1f}x smaller)" if what == "stored" else f" ({whole / actual:.1f}x less than {what})"
    return f" ({actual / whole:.2f}x the size of the files: container overhead)" if what == "stored" \
        else f" (no saving over {what})"


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True))


class BarProgress(Progress):
    """A click progress bar on stderr when it is a terminal (bytes done of the total, rate and
    ETA for byte phases; a count for others); silent otherwise."""

    def __init__(self):
        self.bar = None
        self.enabled = sys.stderr.isatty()

    def start(self, total, label, unit="bytes"):
        self.close()
        if self.enabled and total:
            self.total, self.done, self.unit, self.t0 = total, 0, unit, time.monotonic()
            self.bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=False,
                                         show_percent=True, show_eta=True, item_show_func=self._detail)
            self.bar.__enter__()

    def _detail(self, _item) -> str:
        if self.unit != "bytes":
            return f"{self.done}/{self.total} {self.unit}"
        rate = self.done / max(time.monotonic() - self.t0, 1e-3)
        return f"{human(self.done)}/{human(self.total)} {human(rate)}/s"

    def advance(self, n):
        if self.bar is not None:
            self.done += n
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


PATHS_MARK = "\x00--"  # where a "--" stood, for commands that take REVs and PATHs


def git_habits(args: list[str]) -> list[str]:
    """Command lines as git users type them, rewritten for click: `-C DIR` before the verb,
    `log -3`, and the `--` that separates REVs from PATHs (kept as PATHS_MARK where a
    command takes both; `checkout -- PATH` is `checkout HEAD -- PATH`)."""
    while len(args) >= 2 and args[0] == "-C":
        os.chdir(args[1])
        args = args[2:]
    if not args:
        return args
    verb, rest = args[0], args[1:]
    if verb == "log":
        rest = [f"--max-count={a[1:]}" if re.fullmatch(r"-[0-9]+", a) else a for a in rest]
    if verb in ("log", "diff") and "--" in rest:
        i = rest.index("--")
        rest = rest[:i] + ["--", PATHS_MARK] + rest[i + 1:]
    if verb == "checkout" and rest[:1] == ["--"]:
        rest = ["HEAD", *rest]
    return [verb, *rest]


# git verbs wvc has no command for, and what to type instead
GIT_EQUIVALENTS = {
    "add": "wvc has no staging area: `wvc commit` records the working tree as it is (`.wvcignore` leaves files out)",
    "rm": "delete the file, then `wvc commit`; `wvc restore PATH` brings it back",
    "mv": "rename the file, then `wvc commit`",
    "stash": "wvc has no stash: `wvc switch -c wip && wvc commit -m wip` keeps the work on a branch",
    "rev-parse": "`wvc show REV --json` gives a revision's full commit id",
    "ls-files": "`wvc show --json` lists a version's files",
    "cherry-pick": "wvc has no cherry-pick: `wvc merge REV` merges per tensor",
    "rebase": "`wvc pull --rebase` replays your commits on top of the remote's",
    "blame": "`wvc log -- PATH` lists the commits that changed a file",
}


class WvcGroup(click.Group):
    def resolve_command(self, ctx, args):
        if args and args[0] in GIT_EQUIVALENTS and args[0] not in self.commands:
            raise click.UsageError(f"no command {args[0]!r}: {GIT_EQUIVALENTS[args[0]]}")
        return super().resolve_command(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Like click's standalone mode, but every usage error is one line too."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        args = git_habits(list(sys.argv[1:] if args is None else args))
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            click.echo(f"wvc: error: {exc.format_message()}{hint}", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"wvc: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("wvc: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        quiet_hub_client()
        try:
            return super().invoke(ctx)
        except WvcError as exc:
            click.echo(f"wvc: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BrokenPipeError:  # `wvc log | head`: the reader left; not an error
            sys.stderr.close()
            os._exit(0)
        except KeyboardInterrupt:
            click.echo("wvc: interrupted", err=True)
            sys.exit(130)
        except OSError as exc:
            if exc.errno in (28, 122):  # ENOSPC, EDQUOT: the operation's temp files are gone already
                click.echo(f"wvc: error: no space left on device{' writing ' + str(exc.filename) if exc.filename else ''}; "
                           "nothing was recorded: free some space and run it again", err=True)
                sys.exit(1)
            click.echo(f"wvc: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
            sys.exit(1)
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc):
                raise_damaged(exc)
            click.echo("wvc: error: no space left on device (the repository database could not grow); "
                       "nothing was recorded: free some space and run it again", err=True)
            sys.exit(1)
        except sqlite3.DatabaseError as exc:
            click.echo(f"wvc: error: the repository database is damaged ({exc}); see `wvc fsck`", err=True)
            sys.exit(1)
        except Exception as exc:  # noqa: BLE001 - last line of defence: no tracebacks for users
            if _debug():
                raise
            click.echo(f"wvc: internal error: {type(exc).__name__}: {exc} (WVC_DEBUG=1 shows the traceback)", err=True)
            sys.exit(3)


def _debug() -> bool:
    """WVC_DEBUG, where any error ends: a value that is no switch counts as on (asked for)."""
    try:
        return settings.switch("WVC_DEBUG")
    except WvcError:
        return True


def raise_damaged(exc) -> None:
    click.echo(f"wvc: error: the repository database is damaged ({exc}); see `wvc fsck`", err=True)
    sys.exit(1)


def quiet_hub_client() -> None:
    """wvc draws its own progress; huggingface_hub's bars would interleave with it (and with
    --json output where stderr is captured with stdout). The CLI owns its process, so it may
    say so process-wide; the library never does (a training script keeps its bars)."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars, logging

        disable_progress_bars()
        logging.set_verbosity_error()  # its "Retrying in 1s" lines: wvc retries and reports itself
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")


def open_repo():
    from .api import Repo

    return Repo.open(settings.text("WVC_DIR", "."))


def split_paths(args) -> tuple[list[str], list[str]]:
    """(REVs, PATHs) of a command line that takes `REV... -- PATH...` (click keeps the "--"
    out of the arguments: main() marks where it was)."""
    args = list(args)
    if PATHS_MARK in args:
        i = args.index(PATHS_MARK)
        return args[:i], args[i + 1:]
    return args, []


def echo_stat(files: list[dict], indent: str = "") -> None:
    for f in files:
        sizes = f"{human(f['size_a']) if f['size_a'] is not None else '-'} -> " \
                f"{human(f['size_b']) if f['size_b'] is not None else '-'}"
        click.echo(f"{indent} {f['status']:>8} {f['path']}  {sizes}")
    click.echo(f"{indent} {plural(len(files), 'file')} changed")


def repo_paths(repo, paths) -> list[str]:
    """PATHs given on the command line as the repository's paths: relative ones are taken
    from the current directory, as git takes pathspecs (``cd 1_Pooling && wvc checkout HEAD
    -- config.json`` means ``1_Pooling/config.json``). A path that leaves the repository is
    refused."""
    from .errors import UnsafePath

    here = Path.cwd().resolve()
    out = []
    for raw in paths:
        given = Path(raw)
        full = Path(os.path.normpath(given if given.is_absolute() else here / given))
        try:
            rel = full.relative_to(repo.root)
        except ValueError as exc:
            raise UnsafePath(f"{raw!r} is outside the repository ({repo.root})") from exc
        out.append(rel.as_posix() if rel.parts else ".")
    return out


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


@click.group(cls=WvcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wvc")
def main():
    """wvc: a Git-style, lossless version store for neural-network weights."""


@main.command()
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--branch", "-b", default="main", show_default=True, help="Name of the first branch.")
@click.option("--base", default=None, metavar="hf://ORG/NAME[@REV] | DIR",
              help="Start history from a base model, referenced in place (huggingface_hub cache or DIR): "
                   "never copied into .wvc/, never pushed.")
@click.option("--chunk-size", default=4 << 20, show_default=True, help="Chunk size in bytes.")
@click.option("--max-chain", default=None, type=int,
              help="Most deltas in a chain before re-anchoring to its keyframe (default 8; a chain also "
                   "re-anchors once its deltas outweigh the keyframe). Each step then downloads and stores "
                   "about its own change; 1 keeps checkout cost flat in history, deeper stores less.")
@json_option
def init(path, branch, base, chunk_size, max_chain, as_json):
    """Create an empty repository (.wvc/) in PATH, optionally on a base model."""
    from .api import Repo

    kwargs = {"max_chain": max_chain} if max_chain is not None else {}
    repo = Repo.init(path, chunk_bytes=chunk_size, branch=branch, base=base,
                     progress=BarProgress() if base else NULL_PROGRESS, **kwargs)
    ref = repo.base()
    if as_json:
        emit_json({"path": str(repo.root), "branch": branch, "base": ref.to_json() if ref else None})
    elif ref is None:
        click.echo(f"Initialized empty wvc repository in {repo.wvc_dir}")
    else:
        size = repo.tree_of(ref.commit, weights=False).logical_bytes
        click.echo(f"Initialized wvc repository in {repo.wvc_dir} on base {ref.url} "
                   f"({human(size)}, read in place from {repo.base_dir()}); "
                   f"{branch} is at the base commit {ref.commit[:12]}. Put the fine-tuned files here and "
                   f"`wvc commit`; `wvc checkout {branch}` writes the base's own files here")
    if max_chain == 0 and not as_json:  # allowed, and costly: say so
        click.echo("  --max-chain 0: every changed chunk is stored whole (no deltas between versions)", err=True)


@main.command()
@click.option("-s", "--short", "short", is_flag=True, help="One line a file: M modified, D deleted, ?? new.")
@json_option
def status(short, as_json):
    """Show which files differ from HEAD."""
    st = open_repo().status()
    if as_json:
        return emit_json(st.to_json())
    if short:
        for mark, paths in ((" M", st.modified), (" D", st.deleted), ("??", st.added)):
            for p in paths:
                click.echo(f"{mark} {p}")
        return None
    click.echo(f"On branch {st.branch}" if st.branch else f"HEAD detached at {(st.head or '')[:12]}")
    if st.head is None:
        click.echo("No commits yet")
    for label, paths in (("modified", st.modified), ("deleted", st.deleted), ("new file", st.added)):
        for p in paths:
            click.echo(f"  {label}: {p}")
    for p in st.skipped_symlinks:
        click.echo(f"  skipped symlink (dangling or to a directory): {p}")
    for p in st.nested_repositories:
        click.echo(f"  skipped nested repository: {p}/")
    for p, why in st.bad_names:
        click.echo(f"  cannot be committed: {p} ({why})")
    if st.clean:
        click.echo("nothing to commit, working tree clean")


_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+([eE][-+]?[0-9]+)?|[eE][-+][0-9]+)")


def meta_value(text: str):
    """A --meta value: an int, float, bool or null only when ``text`` is exactly such a
    literal (``step=200`` -> 200, ``lr=1e-5`` -> 1e-05, ``ok=true``); anything else is the
    string itself (``git=8417e93`` stays "8417e93": a hash, not 8.417e96; ``v=NaN`` is "NaN").
    A float needs a decimal point or a signed exponent, so a hex hash of digits and one "e"
    is never read as a number."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text) and math.isfinite(float(text)):
        return float(text)
    return text


def parse_meta(meta, meta_json) -> dict | None:
    metadata = {}
    for option, items in (("--meta", meta), ("--meta-json", meta_json)):
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
            if option == "--meta":
                metadata[key] = meta_value(value)
                continue
            try:
                metadata[key] = json.loads(value, parse_constant=_no_constant)
            except ValueError as exc:
                raise click.BadParameter(f"{key}: not JSON ({exc})", param_hint=option) from exc
    return metadata if (meta or meta_json) else None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


@main.command()
@click.option("-m", "--message", default=None, help="Commit message (with --amend: default the amended one's).")
@click.option("--author", default=None, help="Author (default: $WVC_AUTHOR or user@host).")
@click.option("--allow-empty", is_flag=True, help="Commit even if nothing changed.")
@click.option("--amend", is_flag=True, help="Replace HEAD's commit with this one (the old one stays in the reflog).")
@click.option("--meta", multiple=True, metavar="KEY=VALUE",
              help="Metadata: VALUE is an int, float (with . or a signed exponent), true/false or null when it "
                   "is exactly one, else a string.")
@click.option("--meta-json", multiple=True, metavar="KEY=JSON", help="Metadata whose value is any JSON (lists, objects).")
@click.option("--device", default="auto", show_default=True, help="Where deltas are computed: auto, cpu or cuda.")
@json_option
def commit(message, author, allow_empty, amend, meta, meta_json, device, as_json):
    """Record the working tree as a new commit."""
    if message is None and not amend:
        raise click.UsageError("a commit needs a message: -m MESSAGE")
    if message is not None and not message.strip():  # as git: an empty message aborts the commit
        raise click.UsageError("aborting commit due to an empty message (-m '')")
    metadata = parse_meta(meta, meta_json)
    repo = open_repo()
    t0 = time.perf_counter()
    res = repo.commit(message, author=author, metadata=metadata, allow_empty=allow_empty, device=device,
                      amend=amend, progress=BarProgress())
    message = repo.read_commit(res.commit).message
    if as_json:
        return emit_json({**res.to_json(), "seconds": round(time.perf_counter() - t0, 3)})
    ratio = ratio_note(res.logical_bytes, res.stored_bytes)
    click.echo(f"[{repo.head_branch() or 'detached'} {res.commit[:12]}] {message.splitlines()[0] if message else ''}")
    click.echo(f"  {human(res.logical_bytes)} of files, {human(res.stored_bytes)} stored{ratio}")
    if res.linked_files:
        its = "its" if len(res.linked_files) == 1 else "their"
        click.echo(f"  {plural(len(res.linked_files), 'symlinked file')} committed as {its} content: "
                   + ", ".join(res.linked_files[:5]) + (" ..." if len(res.linked_files) > 5 else ""))
    for p in res.skipped_symlinks:
        click.echo(f"  skipped symlink (dangling or to a directory): {p}")
    for p in res.nested_repositories:
        click.echo(f"  skipped nested repository: {p}/")


@main.command()
@click.argument("revs", nargs=-1)
@click.option("--oneline", is_flag=True, help="One line per commit.")
@click.option("--graph", is_flag=True, help="Draw the history as a graph.")
@click.option("--all", "all_refs", is_flag=True, help="Start from every branch and tag.")
@click.option("-n", "--max-count", "max_count", type=click.IntRange(min=0), default=None,
              help="Show at most N commits (-N says the same).")
@click.option("--stat", is_flag=True, help="List the files each commit changed.")
@json_option
def log(revs, oneline, graph, all_refs, max_count, stat, as_json):
    """Show the commit history: `log [REV | A..B] [^REV...] [-- PATH...]`."""
    from .ops.history import graph_lines

    repo = open_repo()
    revs, paths = split_paths(revs)
    starts = [r for r in revs if not r.startswith("^")]
    if len(starts) > 1:
        raise click.UsageError("one REV (or A..B) at a time; exclude history with ^REV")
    rev = starts[0] if starts else "HEAD"
    entries = repo.log(rev, max_count, all_refs=all_refs, exclude=tuple(r[1:] for r in revs if r.startswith("^")),
                       paths=tuple(repo_paths(repo, paths)))
    if not entries and rev == "HEAD" and not all_refs and not paths and (others := repo.branches()):
        click.echo(f"{repo.head_branch() or 'HEAD'} has no commits yet; other branches have: "
                   + ", ".join(sorted(others)[:5]) + (" ..." if len(others) > 5 else "")
                   + f" (`wvc log {sorted(others)[0]}` or `wvc log --all`)", err=True)
    if as_json:
        return emit_json({"commits": [{**e.to_json(), **({"files": repo.changed_files(e.id)} if stat else {})}
                                      for e in entries]})
    rows = graph_lines(entries) if graph else [("", e) for e in entries]
    for prefix, e in rows:
        pad = prefix + " " if prefix else ""
        if e is None:
            click.echo(prefix)
            continue
        refs = f" ({', '.join(e.refs)})" if e.refs else ""
        summary = e.message.splitlines()[0] if e.message else ""
        if e.pruned:
            refs += " [pruned]"
        if oneline:
            click.echo(f"{pad}{click.style(e.id[:12], fg='yellow')}{refs} {summary}")
            if stat:
                echo_stat(repo.changed_files(e.id), "".join("|" if c in "*|" else " " for c in prefix) + " ")
            continue
        cont = "".join("|" if c in "*|" else " " for c in prefix) + " " if prefix else ""
        click.echo(f"{pad}{click.style('commit ' + e.id, fg='yellow')}{refs}")
        click.echo(f"{cont}Author: {e.author}")
        click.echo(f"{cont}Date:   {time.strftime('%Y-%m-%d %H:%M:%S %z', time.localtime(e.timestamp))}")
        if e.stored_bytes is not None:
            click.echo(f"{cont}Stored: {human(e.stored_bytes)}")
        if e.metadata:
            click.echo(f"{cont}Meta:   {json.dumps(e.metadata, sort_keys=True)}")
        click.echo(cont)
        for line in e.message.splitlines() or [""]:
            click.echo(f"{cont}    {line}")
        click.echo(cont)
        if stat:
            echo_stat(repo.changed_files(e.id), cont)


@main.command()
@click.argument("rev", default="HEAD")
@click.option("--stat", is_flag=True, help="List the files this commit changed (against its first parent).")
@json_option
def show(rev, stat, as_json):
    """Show one commit: message, metadata and files."""
    repo = open_repo()
    if ":" in rev:
        raise click.UsageError(f"show takes a commit; for one file of a version: `wvc cat {rev}`")
    info = repo.show(rev)
    if stat:
        info["changed"] = repo.changed_files(info["commit"])
    if as_json:
        return emit_json(info)
    click.echo(f"commit {info['commit']}")
    click.echo(f"Tree:   {info['tree']}")
    for p in info["parents"]:
        click.echo(f"Parent: {p}")
    click.echo(f"Author: {info['author']}")
    click.echo(f"Date:   {time.strftime('%Y-%m-%d %H:%M:%S %z', time.localtime(info['timestamp']))}")
    if info["metadata"]:
        click.echo(f"Meta:   {json.dumps(info['metadata'], sort_keys=True)}")
    click.echo(f"Size:   {human(info['logical_bytes'])} of files, {human(info['stored_bytes'])} stored by this commit")
    click.echo("")
    for line in info["message"].splitlines():
        click.echo(f"    {line}")
    click.echo("")
    if stat:
        return echo_stat(info["changed"])
    for f in info["files"]:
        extra = f" ({plural(f['tensors'], 'tensor')})" if f["kind"] == "safetensors" else ""
        click.echo(f"  {f['path']}  {human(f['size'])}{extra}")


@main.command()
@click.argument("revs", nargs=-1)
@click.option("--stat", is_flag=True, help="Per-file summary only (no tensor decoding).")
@click.option("--name-only", is_flag=True, help="Only the paths of the files that differ.")
@json_option
def diff(revs, stat, name_only, as_json):
    """Per-tensor changes between REV_A (default HEAD) and REV_B (default: the working tree);
    `diff [REV_A [REV_B]] -- PATH...` limits it to those files; text files (JSON, configs)
    get a unified diff of their lines."""
    repo = open_repo()
    revs, paths = split_paths(revs)
    if len(revs) > 2:
        raise click.UsageError("at most two REVs")
    rev_a, rev_b = (list(revs) + [None, None])[:2]
    result = repo.diff(rev_a, rev_b, stat=stat or name_only, paths=tuple(repo_paths(repo, paths)),
                       progress=BarProgress())
    if name_only:
        if as_json:
            return emit_json({"files": [f["path"] for f in result["files"]]})
        for f in result["files"]:
            click.echo(f["path"])
        return None
    if as_json:
        return emit_json(result)
    for f in result["files"]:
        stored = f" stored {human(f['stored_bytes'])}" if f["stored_bytes"] is not None else ""
        click.echo(f"{f['status']:>8} {f['path']}  {human(f['size_a'])} -> {human(f['size_b'])}{stored}")
    if not stat:
        text_diffs(repo, rev_a, rev_b, result["files"])
    if stat or not result["tensors"]:
        return
    click.echo("")
    click.echo(f"{'tensor':<48} {'changed':>16} {'max|d|':>10} {'rel L2':>10} {'stored':>10}")
    for t in result["tensors"]:
        name = t["name"] if len(t["name"]) <= 48 else t["name"][:45] + "..."
        if t["status"] in ("retyped", "reshaped"):
            was = f"{t['old_dtype']} {tuple(t['old_shape'])} -> {t['dtype']} {tuple(t['shape'])}"
            click.echo(f"{name:<48} {t['status']:>16}  {was}")
            continue
        if t["status"] != "modified":
            click.echo(f"{name:<48} {t['status']:>16}")
            continue
        pct = 100 * t["changed"] / t["numel"] if t["numel"] else 0
        rel = f"{t['rel_l2']:.2e}" if t["rel_l2"] is not None else "inf"
        click.echo(
            f"{name:<48} {t['changed']:>9} ({pct:4.1f}%) {t['max_abs_delta']:>10.3g} {rel:>10} {human(t['stored_bytes']):>10}"
        )


TEXT_SUFFIXES = (".json", ".txt", ".md", ".yaml", ".yml", ".py", ".cfg", ".toml", ".model.json", ".jinja")
MAX_TEXT_DIFF_BYTES = 1 << 20


def text_diffs(repo, rev_a, rev_b, files) -> None:
    """A unified diff of each changed text file (configs, tokenizer JSON) up to 1 MiB a side."""
    import difflib

    from .read.view import VersionView

    texts = [f["path"] for f in files if f["status"] == "modified" and f["path"].endswith(TEXT_SUFFIXES)]
    if not texts:
        return
    views = {}  # each version opened once, on this repository's store

    def side(rev, path):
        if rev is None:  # the working tree
            p = repo.root / path
            return p.read_bytes() if p.is_file() and p.stat().st_size <= MAX_TEXT_DIFF_BYTES else None
        if rev not in views:
            commit = repo.resolve(rev)
            views[rev] = VersionView(commit, repo.tree_of(commit), repo.read_chunk)
        entry = views[rev].tree.by_path().get(path)
        return views[rev].read_file(path) if entry is not None and entry.size <= MAX_TEXT_DIFF_BYTES else None

    for path in texts:
        a, b = side(rev_a or "HEAD", path), side(rev_b, path)
        if a is None or b is None:
            continue
        try:
            lines_a, lines_b = a.decode("utf-8").splitlines(), b.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        for line in difflib.unified_diff(lines_a, lines_b, f"a/{path}", f"b/{path}", lineterm=""):
            click.echo(line)


@main.command()
@click.argument("name")
@click.argument("start", required=False)
@click.option("-c", "--create", is_flag=True, help="Create branch NAME (at START, default HEAD) first.")
@click.option("--force", "-f", is_flag=True, help="Overwrite uncommitted changes.")
@json_option
def switch(name, start, create, force, as_json):
    """Switch the working tree and HEAD to branch NAME (`switch -c NAME` creates it)."""
    repo = open_repo()
    if create:
        repo.create_branch(name, start or "HEAD")
    elif start is not None:
        raise click.UsageError("START needs -c")
    elif name not in repo.branches():
        raise click.UsageError(f"no branch {name!r} (`wvc switch -c {name}` creates it; "
                               f"`wvc checkout {name}` checks out any revision)")
    res = repo.checkout(name, force=force, progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    click.echo(f"Switched to branch {name}: {plural(res.written, 'file')} written, {res.removed} removed")


@main.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--source", "-s", default="HEAD", show_default=True, help="The version to restore from.")
@json_option
def restore(paths, source, as_json):
    """Discard the working tree's changes to PATH... (restore them as SOURCE has them)."""
    repo = open_repo()
    res = repo.checkout(source, paths=repo_paths(repo, paths), progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    click.echo(f"Restored {plural(len(res.restored), 'file')} from {res.commit[:12]}: "
               + ", ".join(res.restored[:5]) + (" ..." if len(res.restored) > 5 else ""))


@main.command()
@click.argument("rev")
@click.argument("paths", nargs=-1)
@click.option("--force", "-f", is_flag=True, help="Overwrite uncommitted changes.")
@click.option("--output", "-o", type=click.Path(file_okay=False), default=None, help="Write the version into DIR instead.")
@click.option("-b", "new_branch", default=None, metavar="NAME", help="Create branch NAME at REV and switch to it.")
@json_option
def checkout(rev, paths, force, output, new_branch, as_json):
    """Make the working tree (or --output DIR) hold version REV; `checkout REV -- PATH...`
    restores those files (or directories) from REV and leaves HEAD where it is."""
    if paths and output:
        raise click.UsageError("PATH... and --output: choose one")
    repo = open_repo()
    if new_branch is not None:  # `checkout -b NAME [START]`: REV is then NAME's start
        if paths or output:
            raise click.UsageError("-b takes NAME [START] only")
        repo.create_branch(new_branch, rev)
        rev = new_branch
    res = repo.checkout(rev, force=force, output=output, paths=repo_paths(repo, paths) or None, progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    if res.restored is not None:
        return click.echo(f"Restored {plural(len(res.restored), 'file')} from {res.commit[:12]}: "
                          + ", ".join(res.restored[:5]) + (" ..." if len(res.restored) > 5 else ""))
    where = res.output or (f"branch {res.branch}" if res.branch else f"detached HEAD {res.commit[:12]}")
    click.echo(f"Checked out {res.commit[:12]} to {where}: {plural(res.written, 'file')} written, {res.removed} removed")


@main.command()
@click.argument("rev")
@click.option("--soft", "mode", flag_value="soft", help="Move the branch only.")
@click.option("--mixed", "mode", flag_value="mixed", default=True,
              help="Move the branch only (the default; wvc has no staging area, so the same as --soft).")
@click.option("--hard", "mode", flag_value="hard", help="Move the branch and make the working tree hold REV "
              "(uncommitted changes are lost).")
@json_option
def reset(rev, mode, as_json):
    """Move the current branch (or detached HEAD) to REV; undo with `wvc reset HEAD@{1}`."""
    res = open_repo().reset(rev, mode=mode, progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    where = res.branch or "detached HEAD"
    files = f"; {plural(res.written, 'file')} written, {res.removed} removed" if mode == "hard" else ""
    click.echo(f"{where} is now at {res.new[:12]} (was {(res.old or '(none)')[:12]}){files}")


@main.command()
@click.argument("ref", default="HEAD")
@click.option("-n", "max_count", type=int, default=None, help="Show at most N entries.")
@json_option
def reflog(ref, max_count, as_json):
    """Where REF (HEAD, a branch or a tag) pointed, newest first: REF@{n} names each."""
    entries = open_repo().reflog(ref, max_count)
    if as_json:
        return emit_json({"ref": ref, "entries": entries})
    for e in entries:
        click.echo(f"{click.style((e['new'] or '(deleted)')[:12], fg='yellow')} {e['selector']}: {e['message']}")


def _ref_command(kind: str):
    plural = {"branch": "branches", "tag": "tags"}[kind]

    @click.argument("name", required=False)
    @click.argument("start", required=False)
    @click.option("-d", "--delete", "delete", default=None, metavar="NAME",
                  help=f"Delete {kind} NAME" + (" (refused if HEAD does not contain it)." if kind == "branch" else "."))
    @json_option
    def command(name, start, delete, as_json, show_all=False, force_delete=None, force=False, rename=None,
                show_current=False):
        repo = open_repo()
        if show_current:
            current = repo.head_branch()
            return emit_json({"current": current}) if as_json else (click.echo(current) if current else None)
        if rename:
            target = repo.rename_branch(*rename)
            return emit_json({"renamed": rename[0], "to": rename[1], "commit": target}) if as_json else click.echo(
                f"Renamed branch {rename[0]} to {rename[1]}")
        if force_delete:
            delete = force_delete
        if delete:
            target = repo.delete_branch(delete, force=bool(force_delete)) if kind == "branch" else repo.delete_tag(delete)
            return emit_json({"deleted": delete, "was": target}) if as_json else click.echo(
                f"Deleted {kind} {delete} (was {target[:12]})"
            )
        if force:
            if not name:
                raise click.UsageError("-f needs NAME [START]")
            old, target = repo.force_branch(name, start or "HEAD")
            return emit_json({"branch": name, "old": old, "commit": target}) if as_json else click.echo(
                f"Branch {name} is now at {target[:12]} (was {(old or '(new)')[:12]})"
            )
        if name:
            target = getattr(repo, f"create_{kind}")(name, start or "HEAD")
            return emit_json({"created": name, "commit": target}) if as_json else click.echo(
                f"Created {kind} {name} at {target[:12]}"
            )
        refs = getattr(repo, plural)()
        current = repo.head_branch() if kind == "branch" else None
        remote = repo.remote_branches() if show_all and kind == "branch" else {}
        if as_json:
            return emit_json({plural: refs, "current": current, **({"remote": remote} if show_all else {})})
        for ref, target in refs.items():
            mark = "*" if ref == current else " "
            click.echo(f"{mark} {ref:<30} {target[:12]}")
        for ref, target in remote.items():
            click.echo(f"  {'remotes/' + ref:<30} {target[:12]}")

    return command


_branch = _ref_command("branch")
_branch = click.option("-m", "--move", "rename", nargs=2, default=None, metavar="OLD NEW",
                       help="Rename branch OLD to NEW (HEAD follows it).")(_branch)
_branch = click.option("--show-current", is_flag=True, help="Print the current branch (nothing when detached).")(_branch)
_branch = click.option("-D", "force_delete", default=None, metavar="NAME", help="Delete branch NAME even if unmerged.")(_branch)
_branch = click.option("-f", "--force", "force", is_flag=True, help="Create NAME or move it to START.")(_branch)
_branch = click.option("-a", "--all", "show_all", is_flag=True, help="Also list remote-tracking branches.")(_branch)
main.command(name="branch", help="List branches, create NAME at START (default HEAD), move one (-f), or delete "
                                 "one (-d, -D).")(_branch)
main.command(name="tag", help="List tags, create NAME at START (default HEAD), or -d NAME.")(_ref_command("tag"))


@main.group(invoke_without_command=True)
@click.option("-v", "--verbose", is_flag=True, help="With no subcommand: list remotes with their URLs.")
@click.pass_context
def remote(ctx, verbose):
    """Manage remotes: add NAME URL, remove NAME, rename OLD NEW, set-url NAME URL, list."""
    if ctx.invoked_subcommand is None:
        for name, url in open_repo().remotes().items():
            click.echo(f"{name}\t{url} (fetch)\n{name}\t{url} (push)" if verbose else name)


@remote.command("rename")
@click.argument("old")
@click.argument("new")
@json_option
def remote_rename(old, new, as_json):
    """Rename remote OLD to NEW (its remote-tracking branches follow)."""
    open_repo().remote_rename(old, new)
    if as_json:
        emit_json({"renamed": old, "to": new})


@remote.command("set-url")
@click.argument("name")
@click.argument("url")
@json_option
def remote_set_url(name, url, as_json):
    """Point remote NAME at URL."""
    repo = open_repo()
    repo.remote_set_url(name, url)
    if as_json:
        emit_json({"remote": name, "url": repo.remotes()[name]})


@remote.command("add")
@click.argument("name")
@click.argument("url")
@json_option
def remote_add(name, url, as_json):
    """Add remote NAME at URL (hf://user/repo, a path, or file:///path)."""
    repo = open_repo()
    repo.remote_add(name, url)
    if as_json:
        emit_json({"added": name, "url": repo.remotes()[name]})


@remote.command("remove")
@click.argument("name")
@json_option
def remote_remove(name, as_json):
    """Remove remote NAME and its remote-tracking branches."""
    open_repo().remote_remove(name)
    if as_json:
        emit_json({"removed": name})


@remote.command("list")
@json_option
def remote_list(as_json):
    """List remotes."""
    rs = open_repo().remotes()
    if as_json:
        return emit_json({"remotes": rs})
    for name, url in rs.items():
        click.echo(f"{name}\t{url}")


@main.command()
@click.argument("remote_name", default="origin")
@click.argument("branch", required=False)
@click.option("--force", "-f", is_flag=True, help="Overwrite the remote branch even if it is not a fast-forward.")
@click.option("--tags", is_flag=True, help="Push every tag too (alone: only the tags).")
@click.option("--delete", "-d", "delete", is_flag=True, help="Delete BRANCH (or tag) on the remote; `:BRANCH` says the same.")
@json_option
def push(remote_name, branch, force, tags, delete, as_json):
    """Upload BRANCH or TAG (default: the current branch) and the objects the remote lacks;
    `push --delete REMOTE BRANCH` (or `push REMOTE :BRANCH`) deletes it there."""
    if branch is not None and branch.startswith(":"):
        delete, branch = True, branch[1:]
    if delete:
        if not branch:
            raise click.UsageError("--delete needs the BRANCH to delete")
        res = open_repo().delete_remote_branch(remote_name, branch)
        if as_json:
            return emit_json(res)
        return click.echo(f"deleted {remote_name}/{branch} (was {res['was'][:12]}); "
                          f"`wvc gc --remote {remote_name}` frees what only it held")
    repo = open_repo()
    res = repo.push(remote_name, branch, force=force, tags=tags, progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    if res.tags:
        from .store.refs import TAGS

        click.echo(f"{plural(len(res.tags), 'tag')} -> {remote_name}: " + ", ".join(t[len(TAGS):] for t in res.tags))
    if branch is not None and branch in repo.tags() and branch not in repo.branches():
        return None if res.tags else click.echo(f"tag {branch} is on {remote_name} already")
    if res.old == res.new or (tags and branch is None):
        return None if res.tags else click.echo(f"{remote_name}/{res.branch} is up to date")
    saved = f" for a {human(res.logical_bytes)} version{ratio_note(res.logical_bytes, res.uploaded_bytes, 'a full upload')}" \
        if res.uploaded_bytes else ""
    click.echo(f"{(res.old or '(new)')[:12]}..{res.new[:12]} {res.branch} -> {remote_name}/{res.branch}"
               f"{' (forced)' if res.forced else ''}: {plural(res.commits, 'commit')}, {human(res.uploaded_bytes)} uploaded{saved}"
               f"{base_note(res.base, pushed=True)}")


@main.command()
@click.argument("remote_name", default="origin")
@json_option
def fetch(remote_name, as_json):
    """Download the remote's branches and the objects they need (verified)."""
    res = open_repo().fetch(remote_name, progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    click.echo(f"fetched {plural(res.commits, 'commit')}, {human(res.downloaded_bytes)} from {remote_name}")
    for branch, target in sorted(res.refs.items()):
        click.echo(f"  {remote_name}/{branch} -> {target[:12]}")
    for tag, target in sorted(res.tags.items()):
        click.echo(f"  new tag {tag} -> {target[:12]}")


@main.command()
@click.argument("remote_name", default="origin")
@click.argument("branch", required=False)
@click.option("--rebase", is_flag=True, help="If the branches diverged, replay your commits on top of the remote's.")
@click.option("--merge", "do_merge", is_flag=True, help="If the branches diverged, merge the remote's into yours.")
@click.option("--strategy", default=None, help="With --merge: how to settle conflicting tensors (see `wvc merge`).")
@click.option("--ff-only", is_flag=True, help="Only fast-forward (the default without --rebase or --merge).")
@json_option
def pull(remote_name, branch, rebase, do_merge, strategy, ff_only, as_json):
    """Fetch, then fast-forward BRANCH (default: the current one) and the working tree."""
    if rebase and do_merge or ff_only and (rebase or do_merge):
        raise click.UsageError("--rebase, --merge and --ff-only: choose one")
    res = open_repo().pull(remote_name, branch, rebase=rebase, merge=do_merge, strategy=strategy,
                           progress=BarProgress())
    if as_json:
        return emit_json(res)
    if res["old"] == res["new"]:
        return click.echo("Already up to date.")
    if res.get("merged"):
        return click.echo(f"Merged {remote_name}/{res['branch']} into {res['branch']}: {res['new'][:12]} "
                          f"({human(res['downloaded_bytes'])} downloaded)")
    if res.get("rebased") is not None:
        return click.echo(f"Rebased {plural(res['rebased'], 'commit')} of {res['branch']} onto {remote_name}/{res['branch']} "
                          f"({res['onto'][:12]}): now at {res['new'][:12]} ({human(res['downloaded_bytes'])} downloaded)")
    click.echo(f"Fast-forward {res['branch']} {(res['old'] or '(none)')[:12]}..{res['new'][:12]} "
               f"({human(res['downloaded_bytes'])} downloaded)")


@main.command()
@click.argument("rev")
@click.option("--strategy", "-s", default=None,
              type=click.Choice(["ours", "theirs", "linear", "task-arithmetic", "ties", "dare-linear", "dare-ties",
                                 "slerp"]),
              help="How to settle tensors both sides changed (none: such a conflict refuses the merge).")
@click.option("--weight", "weights", multiple=True, metavar="ours=W|theirs=W",
              help="Weight of a side for linear, task-arithmetic, ties and dare (default 0.5 each).")
@click.option("--density", default=1.0, show_default=True, type=float, help="ties / dare: share of each task vector kept.")
@click.option("--lambda", "lam", default=1.0, show_default=True, type=float, help="Scale of the merged task vector.")
@click.option("--seed", default=0, show_default=True, type=int, help="dare: seed of the random drop.")
@click.option("--t", "t", default=0.5, show_default=True, type=float, help="slerp: 0 is ours, 1 is theirs.")
@click.option("--no-commit", is_flag=True, help="Write the result to the working tree; `wvc commit` records it.")
@click.option("-m", "--message", default=None, help="Message of the merge commit.")
@json_option
def merge(rev, strategy, weights, density, lam, seed, t, no_commit, message, as_json):
    """Three-way merge of REV into the current branch, per tensor (docs/merge.md)."""
    from .ops.merge import MergeConflict

    sides = {"ours": 0.5, "theirs": 0.5}
    for item in weights:
        side, _, value = item.partition("=")
        try:
            if side not in sides:
                raise ValueError
            sides[side] = float(value)
        except ValueError as exc:
            raise click.UsageError(f"--weight {item!r}: expected ours=W or theirs=W") from exc
    try:
        res = open_repo().merge(rev, strategy=strategy, weights=(sides["ours"], sides["theirs"]), density=density,
                                lam=lam, seed=seed, t=t, no_commit=no_commit, message=message,
                                progress=BarProgress())
    except MergeConflict as exc:
        if as_json:
            emit_json({"status": "conflict", "conflicts": exc.conflicts})
        raise
    if as_json:
        return emit_json(res.to_json())
    if res.status == "up-to-date":
        return click.echo("Already up to date.")
    if res.status == "fast-forward":
        return click.echo(f"Fast-forward to {res.commit[:12]}")
    note = f" (criss-cross: {len(res.merge_bases)} merge bases, used the newest, {res.merge_base[:12]})" \
        if len(res.merge_bases) > 1 else ""
    computed = f", {plural(len(res.computed), 'tensor')} computed with {res.strategy}" if res.computed else ""
    resolved = f", {plural(len(res.resolved), 'conflict')} settled with {res.strategy}" if res.resolved else ""
    if res.status == "written":
        return click.echo(f"Merge result written to the working tree{computed}{resolved}{note}; "
                          "`wvc commit` records it")
    click.echo(f"Merged {rev}: {res.commit[:12]} ({plural(len(res.from_theirs), 'change')} taken from {rev}{computed}{resolved}, "
               f"{human(res.stored_bytes)} stored){note}")


@main.command()
@click.argument("url")
@click.argument("directory", required=False)
@click.option("--branch", "-b", default=None, help="Branch to check out (default: main).")
@click.option("--lazy", is_flag=True, help="Fetch history (commits, trees) now and weights on first use: "
              "only the checked-out version is downloaded.")
@click.option("--base-dir", type=click.Path(file_okay=False), default=None,
              help="Where this machine has the base model, when the remote's base is a directory (not a Hub repo).")
@json_option
def clone(url, directory, branch, lazy, base_dir, as_json):
    """Copy a remote repository into DIRECTORY and check out a branch."""
    from .api import clone_with_report

    repo, info = clone_with_report(url, directory, branch=branch, lazy=lazy, base_dir=base_dir, progress=BarProgress())
    if as_json:
        return emit_json(info)
    what = "that version (lazy: other versions on first use)" if lazy else "that version with all its history"
    click.echo(f"Cloned {url} into {info['path']} ({info['branch']} at {info['commit'][:12]}: "
               f"{human(info['downloaded_bytes'])} downloaded for a {human(info['logical_bytes'])} version: {what})"
               f"{base_note(info.get('base'), pushed=False)}")


def base_note(base: dict | None, *, pushed: bool) -> str:
    """What a push or clone did with the base model its history starts from."""
    if not base:
        return ""
    size = human(base["logical_bytes"])
    if pushed:
        where = "a clone fetches it from the Hub" if base["source"] != "directory" else "a clone needs it (--base-dir)"
        return f"; base {base['url']} ({size}) not uploaded: {where}"
    if base["source"] == "directory":
        return f"; base {base['url']} ({size}) read in place"
    if base["source"] == "hub cache":
        return f"; base {base['url']} ({size}) from the Hub cache"
    return f"; base {base['url']} ({size}): {human(base['downloaded_bytes'])} downloaded from the Hub"


@main.command()
@click.option("--grace", default=3600, show_default=True, type=click.IntRange(min=0),
              help="Keep unreferenced files younger than this (seconds).")
@click.option("--remote", "remote_name", default=None, metavar="NAME",
              help="Collect garbage on that remote instead: remove what none of its refs reaches.")
@click.option("--dry-run", is_flag=True, help="With --remote: report what would be freed, change nothing.")
@json_option
def gc(grace, remote_name, dry_run, as_json):
    """Remove unreachable commits and objects, repack, and clear leftovers of crashes."""
    if remote_name is not None:
        res = open_repo().remote_gc(remote_name, dry_run=dry_run, progress=BarProgress())
        if as_json:
            return emit_json(res.to_json())
        verb = "Would remove" if dry_run else "Removed"
        return click.echo(f"{verb} {res.objects_removed} objects and {res.commits_removed} commits from {remote_name} "
                          f"({human(res.bytes_freed)}): {res.segments_removed} of {res.segments_before} segments "
                          f"deleted, {res.segments_rewritten} rewritten")
    if dry_run:
        raise click.UsageError("--dry-run goes with --remote")
    res = open_repo().gc(grace_seconds=grace)
    if as_json:
        return emit_json(res.to_json())
    click.echo(
        f"Removed {plural(res.commits_removed, 'commit')}, {plural(res.objects_removed, 'object')}, "
        f"{plural(res.files_removed, 'leftover file')}; packs {human(res.bytes_before)} -> {human(res.bytes_after)}"
    )
    if res.kept_by_reflog:
        click.echo(f"Kept {plural(res.kept_by_reflog, 'commit')} no branch or tag reaches: the reflog names them "
                   f"(kept {res.reflog_days:g} days; `wvc reflog` lists them)")
    if res.kept_young_objects:
        click.echo(f"Kept {plural(res.kept_young_objects, 'unreachable object')} in packs younger than "
                   f"{res.grace_seconds} s (--grace): a commit running now may still use them")


@main.command()
@click.argument("branch", required=False)
@click.option("--keep-last", "keep_last", type=click.IntRange(min=1), default=None, metavar="K",
              help="Keep the newest K versions.")
@click.option("--keep-every", "keep_every", type=click.IntRange(min=1), default=None, metavar="N",
              help="Keep every version whose step (metadata 'step', else its position from 0) is a multiple of N.")
@click.option("--keep-tagged", is_flag=True, help="Keep the versions tags point at.")
@click.option("--keep-best", "keep_best", multiple=True, metavar="METRIC[:min|max]",
              help="Keep the best version by this metadata metric (default min; repeatable).")
@click.option("--remote", "remote_name", default=None, metavar="NAME",
              help="Prune the branch on that remote instead (what only pruned versions need is removed there).")
@click.option("--dry-run", is_flag=True, help="Report what would be pruned and freed; change nothing.")
@json_option
def prune(branch, keep_last, keep_every, keep_tagged, keep_best, remote_name, dry_run, as_json):
    """Drop the weights of a run's versions the policy does not keep (they stay in the log)."""
    keep = {"last": keep_last or 0, "every": keep_every or 0, "tagged": keep_tagged, "best": keep_best}
    repo = open_repo()
    if remote_name is not None:
        res = repo.remote_prune(remote_name, branch, keep=keep, dry_run=dry_run, progress=BarProgress())
    else:
        res = repo.prune(branch, keep=keep, dry_run=dry_run, progress=BarProgress())
    if as_json:
        return emit_json(res.to_json())
    verb = "Would prune" if dry_run else "Pruned"
    where = f" on {remote_name}" if remote_name else ""
    click.echo(f"{verb} {plural(res.pruned, 'version')} of {res.versions} on {res.branch}{where} "
               f"({res.kept} keep their weights, {res.already_pruned} pruned before); "
               f"{'would free' if dry_run else 'freed'} {human(res.bytes_freed)}, "
               f"{plural(res.chunks_reencoded, 'chunk')} re-encoded for the kept versions")
    reasons = collections.Counter(why for whys in res.kept_reasons.values() for why in whys)
    if reasons:  # why the kept ones keep their weights (each version is counted under each of its reasons)
        click.echo("Kept by: " + ", ".join(f"{why} ({n})" for why, n in reasons.most_common()))


@main.command()
@json_option
def fsck(as_json):
    """Verify every pack, object, tree, commit and ref."""
    res = open_repo().fsck()
    if as_json:
        emit_json(res.to_json())
    else:
        for err in res.errors:
            click.echo(f"error: {err}")
        for name in res.leftovers:
            click.echo(f"leftover (gc removes it): {name}")
        if res.not_fetched:
            click.echo(f"{plural(len(res.not_fetched), 'chunk')} not fetched yet (lazy clone: fetched from the remote on use)")
        base = f", {res.base_objects} base chunks" if res.base_objects else ""
        click.echo(f"checked {res.packs} packs, {res.objects} objects{base}, {res.commits} commits: "
                   + ("ok" if res.ok else plural(len(res.errors), "problem")))
    if not res.ok:
        sys.exit(1)


@main.command()
@json_option
def stats(as_json):
    """Storage statistics: logical bytes versus bytes stored."""
    s = open_repo().stats()
    if as_json:
        return emit_json(s)
    click.echo(f"commits {s['commits']}, branches {s['branches']}, tags {s['tags']}, objects {s['objects']}, packs {s['packs']}")
    if s["base"]:
        click.echo(f"base:                 {s['base']['url']} ({human(s['base']['bytes'])}, read in place, not stored)")
    click.echo(f"HEAD version:         {human(s['head_logical_bytes'])}")
    click.echo(f"all versions (files): {human(s['logical_bytes'])}")
    ratio = f" ({s['ratio']:.1f}x smaller)" if s["ratio"] else ""
    click.echo(f"stored:               {human(s['stored_bytes'])}{ratio}")
    for method, v in sorted(s["objects_by_method"].items()):
        click.echo(f"  {method:<8} {v['objects']:>8} objects {human(v['bytes']):>10}")


@main.command("ui")
@click.argument("source", required=False, metavar="[REMOTE_URL]")
@click.option("--port", default=8733, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1 (0: any free one).")
@click.option("--no-browser", is_flag=True, help="Print the address; do not open a browser.")
@click.option("--rev", "revs", multiple=True, metavar="REV", help="Histories to prepare (default: every branch).")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(min=1),
              help="Commits of each history to show.")
def ui_command(source, port, no_browser, revs, limit):
    """A read-only web view of the history: change map, metrics, storage, compare.

    Serves on 127.0.0.1 only. With REMOTE_URL, a lazy clone of the remote is kept in the
    cache ($WVC_CACHE/ui) and only what the views show is downloaded."""
    import webbrowser

    from .ui import server

    repo = open_repo() if source is None else _ui_copy_of(source)
    server.prepare(repo, list(revs) or None, limit, BarProgress())
    srv = server.Server(repo, port, source or "")
    click.echo(f"wvc ui: serving {srv.url} (read-only, loopback only; Ctrl-C stops)")
    if not no_browser:
        webbrowser.open(srv.url)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


def _ui_copy_of(url: str):
    from .ui.remote_copy import local_copy

    return local_copy(url, BarProgress())


@main.command("plot")
@click.argument("kind", type=click.Choice(["changes", "metrics", "storage"]))
@click.argument("rev_range", required=False, metavar="[REV | A..B]")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="FILE.svg or FILE.png.")
@click.option("--metric", default="rel_l2", show_default=True, type=click.Choice(["rel_l2", "fraction", "ulps"]),
              help="Change map colour: relative L2, fraction of elements changed, max |delta| in ULPs.")
@click.option("--branch", "branches", multiple=True, help="metrics: branches to overlay (default: all).")
@click.option("--limit", default=200, show_default=True, help="Commits of the history to draw.")
@json_option
def plot_command(kind, rev_range, output, metric, branches, limit, as_json):
    """Write the change map, the metrics or the storage picture to a file (SVG or PNG)."""
    from pathlib import Path

    from .ui import plot

    text, numbers = plot.picture(open_repo(), kind, rev_range, metric=metric, branches=list(branches) or None,
                                 limit=limit, progress=BarProgress())
    plot.write(text, Path(output))
    if as_json:
        return emit_json({"output": output, "kind": kind, "data": numbers})
    click.echo(f"wrote {output}")


@main.group()
def cache():
    """The local cache of versions snapshot_download made ($WVC_CACHE, else $HF_HOME/wvc)."""


@cache.command("list")
@json_option
def cache_list(as_json):
    """List cached versions: tree, size, when made, and the URL@REV that named each."""
    from .read.cache import cache_root, entries

    found = entries(cache_root())
    if as_json:
        return emit_json({"root": str(cache_root()), "versions": found,
                          "bytes": sum(e["bytes"] for e in found)})
    for e in found:
        made = time.strftime("%Y-%m-%d", time.localtime(e["created"]))
        click.echo(f"{e['tree'][:12]}  {human(e['bytes']):>10}  made {made}  {', '.join(e['names']) or '-'}")
    click.echo(f"{plural(len(found), 'version')}, {human(sum(e['bytes'] for e in found))} in {cache_root()}")


def _finite(value, option: str):
    """A float option's value, refused if NaN (every comparison with it is false: a range accepts it)."""
    if value is not None and value != value:
        raise click.BadParameter(f"{value} is not a number of days", param_hint=option)
    return value


@cache.command("prune")
@click.option("--older-than", "days", type=click.FloatRange(min=0), default=30, show_default=True,
              callback=lambda ctx, param, v: _finite(v, "--older-than"),
              help="Remove versions made more than this many days ago.")
@click.option("--all", "everything", is_flag=True, help="Remove every cached version.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
def cache_prune(days, everything, dry_run, as_json):
    """Remove cached versions (they are downloaded again when asked for)."""
    from .read.cache import cache_root, prune

    res = prune(cache_root(), older_than_days=days, everything=everything, dry_run=dry_run)
    if as_json:
        return emit_json(res)
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {plural(len(res['removed']), 'version')}, {human(res['freed_bytes'])}")


@main.command()
@click.argument("spec", metavar="REV:PATH")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write to FILE instead of stdout.")
def cat(spec, output):
    """Write one file of a version (REV:PATH, e.g. main~2:config.json) to stdout or FILE."""
    from .read.view import open_version

    rev, sep, path = spec.partition(":")
    if not sep or not path:
        raise click.BadParameter("expected REV:PATH", param_hint="REV:PATH")
    repo = open_repo()
    if path.startswith(("./", "../")) or path in (".", ".."):  # as in git: REV:./PATH is from the current directory
        path = repo_paths(repo, [path])[0]
    data = open_version(repo.root, rev or "HEAD").read_file(path)
    if output:
        from .fsutil import atomic_write

        atomic_write(output, data)
    else:
        sys.stdout.flush()  # anything already printed goes first
        sys.stdout.buffer.write(data)  # (click.get_binary_stream is deprecated in click 8.2)
        sys.stdout.buffer.flush()


@main.command()
@click.argument("rev")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["safetensors"]), default="safetensors", show_default=True)
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest shard (5GB, 500MB, 2GiB, bytes).")
@json_option
def export(rev, directory, fmt, max_shard_size, as_json):
    """Write version REV as HF-style sharded safetensors in DIRECTORY (a DCP commit is
    reassembled tensor by tensor): `from_pretrained` reads the result."""
    from .ops.export import parse_size

    res = open_repo().export(rev, directory, max_shard_bytes=parse_size(max_shard_size), progress=BarProgress())
    if as_json:
        return emit_json(res)
    click.echo(f"Exported {res['commit'][:12]} to {res['output']}: {plural(res['tensors'], 'tensor')} "
               f"({human(res['total_bytes'])}) in {plural(len(res['shards']), 'shard')}"
               + (f", {plural(len(res['other_files']), 'other file')}" if res["other_files"] else ""))


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Where to build the demo model (default: a temporary directory).")
@click.option("--steps", default=4, show_default=True, help="Simulated fine-tuning steps to commit.")
@json_option
def demo(directory, steps, as_json):
    """Version a small bf16 model end to end and verify every checkout byte for byte."""
    from .demo import run_demo

    report = run_demo(directory, steps=steps, echo=(lambda *_: None) if as_json else click.echo)
    if as_json:
        emit_json(report)
    if not report["verified"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
