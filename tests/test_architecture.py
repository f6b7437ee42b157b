"""The layer rules of docs/architecture.md ("Layers"), checked over the source: every import,
at module level or inside a function, runs downward; the composition root imports no verb;
SQL lives in store/ (and the stat cache of worktree/scan.py) only."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "wvc"

# Bottom to top. A module may import modules of its own layer or of layers below it. A folder
# is one concern; where its modules sit on different layers, the lower ones are named apart.
LAYERS = [
    ["wvc.errors", "wvc.ids", "wvc.progress", "wvc.settings", "wvc.lru"],
    ["wvc.fsutil", "wvc.formats"],
    ["wvc.model", "wvc.codec"],
    ["wvc.store", "wvc.worktree.scan", "wvc.read.cache"],
    ["wvc.worktree", "wvc.read.tensors", "wvc.remotes"],
    ["wvc.basemodel"],
    ["wvc.repo"],
    ["wvc.ops"],
    ["wvc.api"],
    ["wvc.read", "wvc.integrations", "wvc.demo", "wvc.ui"],
    ["wvc.cli", "wvc.__main__", "wvc"],
    ["wvc.testing"],  # the local Hub, Xet and bucket servers: tests' parts, no product module's
]


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (python tests/test_architecture.py writes docs/architecture.md)"
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of a wvc module in ``path``, function-level ones too."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "wvc"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "wvc":
                continue
            # ``from . import ids`` or ``from .read import tensors``: a name that is a module
            # of that package is what is imported; any other name is the package's (or module's)
            out += [(node.lineno, f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target)
                    for a in node.names]
    return out


SOURCES = sorted(p for p in PACKAGE.rglob("*.py"))
MODULES = {module_name(p) for p in SOURCES}


def test_every_module_is_in_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_run_downward(path):
    me = module_name(path)
    upward = [f"line {line}: {me} (layer {layer_of(me)}) imports {target} (layer {layer_of(target)})"
              for line, target in imports(path) if layer_of(target) > layer_of(me)]
    assert not upward, "\n".join(upward)


def test_the_test_servers_stand_apart():
    """wvc.testing speaks the protocols as a server would, from the protocols alone: it imports
    no product module, and no product module imports it."""
    for path in SOURCES:
        me = module_name(path)
        mine = me.startswith("wvc.testing")
        crossing = [t for _, t in imports(path) if t.startswith("wvc.testing") != mine]
        assert not crossing, f"{me} imports {crossing}"


def test_the_composition_root_imports_no_verb():
    targets = [t for _, t in imports(PACKAGE / "repo.py")]
    assert not [t for t in targets if t.startswith(("wvc.ops", "wvc.api", "wvc.read.view", "wvc.cli"))], targets


def _declared_attributes() -> dict[str, set[str]]:
    """attribute name -> the modules whose classes declare it (a class-level field, or a
    ``self.name = ...`` in one of its methods)."""
    out: dict[str, set[str]] = {}
    for path in SOURCES:
        me = module_name(path)
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    out.setdefault(node.target.id, set()).add(me)
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
                for t in (e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        out.setdefault(t.attr, set()).add(me)
    return out


# ctypes function objects are configured by assigning these, and vLLM's CPU backend dispatches
# a module's matmul through its cpu_linear, which the vLLM writer puts in place of a packed
# copy it prepared (integrations/vllm/engine_weights.py): none is a wvc object
FOREIGN_PROTOCOL = {"argtypes", "restype", "cpu_linear"}


def _foreign_names(tree: ast.Module) -> set[str]:
    """Names a module binds by importing them from another package than wvc."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] != "wvc"}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] != "wvc":
            out |= {a.asname or a.name for a in node.names}
    return out


def test_no_attribute_is_patched_onto_another_layers_object():
    """An object is given what it needs when it is built (a constructor parameter, a method),
    never by assigning an attribute from outside after the fact (the follower once patched
    a remote chunk source that way): every ``x.attr = ...`` with ``x`` not ``self`` must
    name an attribute a class of the same layer declares. The one exception: an integration
    (wvc.integrations) may extend a class of the library it adapts, imported by name, where
    that library offers no hook (vLLM's engine client reporting the loaded commit)."""
    declared = _declared_attributes()
    found = []
    for path in SOURCES:
        me = module_name(path)
        tree = ast.parse(path.read_text())
        foreign = _foreign_names(tree) if me.startswith("wvc.integrations.") else set()
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in (e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])):
                if not isinstance(t, ast.Attribute) or isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                    continue
                if isinstance(t.value, ast.Name) and t.value.id in foreign:
                    continue
                if isinstance(t.value, ast.Attribute) and isinstance(t.value.value, ast.Name) \
                        and t.value.value.id == "self" or t.attr in FOREIGN_PROTOCOL:
                    # self.member.attr: an object this class built and owns (its own module's)
                    if t.attr in FOREIGN_PROTOCOL or me in declared.get(t.attr, set()):
                        continue
                owners = declared.get(t.attr, set())
                if not any(layer_of(o) == layer_of(me) for o in owners):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(t)} "
                                 f"(declared in {sorted(owners) or 'no class'})")
    assert not found, "\n".join(found)


def test_the_environment_is_read_in_settings_only():
    """Every environment variable is read in wvc/settings.py, when used; the CLI may set
    defaults for the libraries it drives. No other module touches os.environ."""
    allowed = {PACKAGE / "settings.py", PACKAGE / "cli.py"}
    found = []
    for path in SOURCES:
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: os.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "os" \
                    and {a.name for a in node.names} & {"environ", "getenv", "putenv"}:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: from os import ...")
    assert not found, "\n".join(found)


def test_every_wvc_variable_the_code_names_is_a_documented_setting():
    from wvc import settings

    readme = (PACKAGE.parent / "docs" / "reference" / "settings.md").read_text()
    named = set()
    for path in SOURCES:
        named |= set(re.findall(r"\bWVC_[A-Z_]+\b", path.read_text()))
    named -= {"WVC_DIR", "WVC_TOP"} - set(settings.VARIABLES)  # (constants of those names, not variables)
    assert named <= set(settings.VARIABLES), sorted(named - set(settings.VARIABLES))
    assert [v for v in settings.VARIABLES if f"`{v}`" not in readme] == []


SQL = re.compile(r"\b(SELECT\s|INSERT\s|UPDATE\s+\w+\s+SET|DELETE\s+FROM|PRAGMA\s|CREATE\s+TABLE)", re.I)


@pytest.mark.parametrize("path", sorted((PACKAGE / "ops").rglob("*.py")) + [PACKAGE / "repo.py", PACKAGE / "api.py"],
                         ids=lambda p: p.name)
def test_no_sql_outside_the_store(path):
    text = path.read_text()
    found = [line.strip() for line in text.splitlines() if SQL.search(line) or ".conn." in line or ".execute(" in line]
    assert not found, found


# Each layer's name and job, as the design's table shows them beside the layer's modules.
LAYER_JOBS = [
    ("basics", "every error class, blake3 ids, progress reporting, the one bounded cache, every environment "
               "variable (read when used; three at import)"),
    ("formats", "atomic writes and path checks; the safetensors header; JSON from an untrusted source, parsed "
                "within bounds; how a DCP save lies in a tree"),
    ("object model, codec", "versions and their ids, how a file lays out as chunks, tree deltas, the merge "
                            "arithmetic, which versions a prune keeps and why; chunk bytes <-> payloads (the "
                            "methods, the C kernels, the device path, the codec pool)"),
    ("storage", "SQLite and its migrations, packs, delta chains, the chunk store and writer, the anchor and "
                "re-encoding policies, a prune's plan, the commit graph, refs, REV syntax; the working-tree "
                "scan and stat cache; the cache of downloaded versions"),
    ("working tree, remotes", "files or a state dict -> chunks and a tree, and back; the working tree refreshed "
                              "to a commit made elsewhere; tensors out of a version; the remote layout map, the "
                              "backend interface and four backends, the remote repository, catalogs, step "
                              "records, compaction, downloads, a lazy clone's chunk supply"),
    ("base models", "a history on a base model: its record, the Hub cache, where each chunk lies in its files"),
    ("composition root", "`Repository`: opens `.wvc/`, builds the parts, records versions; runs no verb"),
    ("operations", "one module a verb (prune: which versions no policy prunes, and the crash-safe steps)"),
    ("API", "`wvc.Repo` (a facade: the verbs and the queries users ask) and `wvc.clone`"),
    ("consumers", "reading versions (`wvc.open`, `wvc.snapshot_download`, `wvc.follow`), a training loop's and "
                  "an inference engine's side (Publisher, Trainer callback, DCP, vLLM, TRL), the demo, "
                  "`wvc ui` and `wvc plot`"),
    ("interface", "click commands (formatting only); `wvc/__init__` loads `wvc.Repo` and `wvc.open` on first use"),
    ("test servers", "the local Hub, its Xet CAS and buckets, for tests and benchmarks: written from the "
                     "protocols, they import no product module and none imports them"),
]
TABLE_HEAD = "| layer | modules | job |"


def layer_table() -> str:
    """docs/architecture.md's Layers table, made from LAYERS and the modules on disk: each layer's
    modules, loose ones first, then by folder."""
    rows = [TABLE_HEAD, "|---|---|---|"]
    for i, (name, job) in enumerate(LAYER_JOBS):
        groups: dict[str, list[str]] = {}
        for path in SOURCES:
            rel = path.relative_to(PACKAGE).with_suffix("")
            if rel.name == "__init__" and rel.parent != Path(".") or layer_of(module_name(path)) != i:
                continue  # (a package's own __init__: the package is named by its modules)
            folder = "" if rel.parent == Path(".") else rel.parent.as_posix() + "/"
            groups.setdefault(folder, []).append("wvc/__init__" if rel == Path("__init__") else rel.name)
        cells = [f"`{m}`" for m in groups.pop("", [])] + [f"`{f}` ({', '.join(ms)})" for f, ms in groups.items()]
        rows.append(f"| {name} | {', '.join(cells)} | {job} |")
    return "\n".join(rows) + "\n"


DESIGN = PACKAGE.parent / "docs" / "architecture.md"


def _table_in_design() -> tuple[int, int]:
    text = DESIGN.read_text()
    start = text.index(TABLE_HEAD)
    return start, text.index("\n\n", start) + 1


def test_architecture_md_s_layer_table_is_made_from_this_test_s_layers():
    """The contract's table names every module on its layer, as this test holds it (issue 52:
    the hand-written one had missed six modules). ``python tests/test_architecture.py``
    writes it."""
    assert len(LAYER_JOBS) == len(LAYERS)
    start, end = _table_in_design()
    assert DESIGN.read_text()[start:end] == layer_table(), "run `python tests/test_architecture.py` to write it"


if __name__ == "__main__":  # write the table into docs/architecture.md
    start, end = _table_in_design()
    text = DESIGN.read_text()
    DESIGN.write_text(text[:start] + layer_table() + text[end:])


URL_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix", "partition", "rpartition", "split", "find",
               "index"}


def _picks_a_url_apart(node) -> bool:
    """A string test or cut with a URL scheme's constant ("hf://", "hf://buckets/", "://")."""
    def schemey(n) -> bool:
        return isinstance(n, ast.Constant) and isinstance(n.value, str) \
            and re.fullmatch(r"([a-z][a-z0-9+.-]*)?://[a-z/]*", n.value) is not None

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in URL_METHODS:
        return any(schemey(a) for a in node.args)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return any(schemey(a) for a in node.args)
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for op in node.ops):
        return any(schemey(n) for n in [node.left, *node.comparators])
    return False


def test_remote_urls_are_parsed_in_one_module():
    """Issue 67: two hf:// parsers with different rules (basemodel/base_ref.py, remotes/hub.py) and
    three more places picking URLs apart; remotes/urls.py is the one parser now."""
    found = []
    for path in SOURCES:
        if path == PACKAGE / "remotes" / "urls.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _picks_a_url_apart(node):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, found


def test_every_logger_is_named_by_its_module():
    """Issue 67: one convention, ``logging.getLogger(__name__)``: every logger sits under the
    ``wvc`` logger by its module's name (five were named by hand: "wvc", "wvc.trl", "wvc.vllm")."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getLogger" \
                    and not (len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, found


def _strings(tree):
    """(node, text) of each string in ``tree`` that is not a docstring, and of each f-string's
    leading text (``f"refs/{i}"``)."""
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node, node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            yield node, str(node.values[0].value)


def test_each_ref_namespace_is_spelled_once():
    """Issue 67: "refs/heads/", "refs/tags/" and "refs/remotes/" were spelled in eleven modules
    (and REMOTES and HEADS defined three times); store/refs.py defines them, all else imports."""
    found = []
    for path in SOURCES:
        # (wvc/testing/hub.py speaks the Hub's API, whose ref names these are too; it imports no wvc)
        if path == PACKAGE / "store" / "refs.py" or path.is_relative_to(PACKAGE / "testing"):
            continue
        for node, text in _strings(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and re.search(r"refs/(heads|tags|remotes)/", text):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text!r}")
    assert not found, found


def test_integrations_use_the_public_repo_not_its_internals():
    """Issue 67: the Publisher, the TRL transfer, DCP, wvc.open and the CLI reached into
    ``repo.internals`` (28 uses) for branch tips, ancestry, HEAD, chunk retention and the pack
    writer, and the web view for change maps and chunk statistics; those are named, documented
    Repo methods now, and ``internals`` is reached in tests only."""
    found = {}
    for path in SOURCES:
        n = sum(1 for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Attribute) and node.attr == "internals")
        if n and path != PACKAGE / "api.py":  # (where it is defined)
            found[str(path.relative_to(PACKAGE.parent))] = n
    assert not found, found


# Module names used in two folders, and why they are one thing (issue 67: "layout" was four
# modules, "transfer" two, "follow" a working-tree update and a live reader).
NAMES_SHARED = {
    # the Hub backend and the local Hub server it talks to in tests: the two sides of one protocol
    "hub": {"wvc/remotes/hub.py", "wvc/testing/hub.py"},
}


def test_no_module_name_means_two_things():
    by_name: dict = {}
    for path in SOURCES:
        if path.name != "__init__.py":
            by_name.setdefault(path.stem, set()).add(str(path.relative_to(PACKAGE.parent)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == NAMES_SHARED


def test_no_integration_finds_what_it_needs_by_reading_frames():
    """Issue 67: the TRL transfer found TRL's trainer in its callers' frames (``sys._getframe``,
    a generator's ``gi_frame.f_locals``); TRL's trainer hands itself over now
    (integrations/trl_hooks.py), and nothing under wvc/ reads a frame."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("_getframe", "currentframe", "gi_frame", "f_locals",
                                                                 "f_back", "cr_frame"):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.attr}")
    assert not found, found


REMOTE_PATHS = re.compile(r"^(packs|catalogs|retired|pruned|steps|attic|objects|reflog)/|^(wvc|base)\.json$")


def test_remote_paths_are_spelled_in_the_layout_map_alone():
    """Issue 67: remote paths were spelled in seven modules (a bucket's reflog/ outside the
    layout), ops/ and basemodel/ called the layout's path builders (and wrote a pruned/
    record's format themselves), and the TRL transfer, the vLLM plugin and the follower read
    refs/heads/ through a backend. Now remotes/layout.py spells every path (the ref namespace
    is store/refs.py's: a remote keeps its refs under their local names), nothing above
    remotes/ imports the layout, and a branch's tip is read through the remote repository."""
    found = []
    for path in SOURCES:
        if path == PACKAGE / "remotes" / "layout.py" or path.is_relative_to(PACKAGE / "testing"):
            continue
        tree = ast.parse(path.read_text())
        above_remotes = not path.is_relative_to(PACKAGE / "remotes")
        for line, target in imports(path):
            if above_remotes and target == "wvc.remotes.layout":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: imports the layout map")
        for node, text in _strings(tree):
            if REMOTE_PATHS.search(text) or text.startswith("refs/") and path != PACKAGE / "store" / "refs.py":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {text!r}")
        if above_remotes:
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: reads a ref through a backend"
                      for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "read_ref"]
    assert not found, "\n".join(found)


BACKENDS = ("interface", "path", "s3", "hub", "bucket")


def test_backends_ask_the_layout_they_are_given_and_import_no_format_rule():
    """Issue 67: the backends imported the format's rules (LISTED_FOLDERS, attic_path, movable,
    check_ref_count, parse_refs, a bucket's reflog/). Now each is given the layout map when it is
    made (``open_backend``: restic's backends get theirs so) and asks it; none imports it."""
    found = [f"wvc/remotes/{name}.py:{line}" for name in BACKENDS
             for line, target in imports(PACKAGE / "remotes" / f"{name}.py") if target == "wvc.remotes.layout"]
    assert not found, found


FILE_METHODS = ("read", "download", "read_range", "write_new", "delete", "move_to_attic", "compose")


def test_every_backend_is_given_handles_not_paths():
    """Issue 67: backends took remote paths; now files cross the interface as handles (kind,
    name) and the layout map alone spells their paths: each backend's file methods take a
    handle (or handles) first, and publish's files are keyed by handle."""
    import inspect

    from wvc.remotes.bucket import BucketBackend
    from wvc.remotes.hub import HubBackend
    from wvc.remotes.interface import Backend
    from wvc.remotes.path import PathBackend
    from wvc.remotes.s3 import S3Backend

    found = []
    for kind in (Backend, PathBackend, S3Backend, HubBackend, BucketBackend):
        for name in FILE_METHODS:
            first = list(inspect.signature(getattr(kind, name)).parameters)[1]
            if first not in ("handle", "handles"):
                found.append(f"{kind.__name__}.{name}({first}, ...)")
        publish = inspect.signature(kind.publish).parameters["files"]
        if kind is Backend and "Handle" not in str(publish.annotation):
            found.append("Backend.publish's files are not keyed by Handle")
    assert not found, found
