"""The layer rules of docs/design.md ("Layers"), checked over the source: every import,
at module level or inside a function, runs downward; the composition root imports no verb;
SQL lives in store/ (and the stat cache of worktree.py) only."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "wvc"

# Bottom to top. A module may import modules of its own layer or of layers below it.
LAYERS = [
    ["wvc.errors", "wvc.ids", "wvc.progress", "wvc.allocator"],
    ["wvc.fsutil", "wvc.formats", "wvc.testing"],
    ["wvc.objects", "wvc.codec", "wvc.device_copy", "wvc.merge_methods"],
    ["wvc.store", "wvc.worktree", "wvc.cache"],
    ["wvc.snapshot", "wvc.revparse", "wvc.remotes"],
    ["wvc.basemodel"],
    ["wvc.repo"],
    ["wvc.ops"],
    ["wvc.api"],
    ["wvc.view", "wvc.follower", "wvc.publisher", "wvc.integrations", "wvc.demo"],
    ["wvc.cli", "wvc.__main__", "wvc"],
]


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and docs/design.md"
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
            if node.module is None or node.level and not node.module:
                # ``from . import ids``: each name is a module of that package
                out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, target))
    return out


SOURCES = sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_run_downward(path):
    me = module_name(path)
    upward = [f"line {line}: {me} (layer {layer_of(me)}) imports {target} (layer {layer_of(target)})"
              for line, target in imports(path) if layer_of(target) > layer_of(me)]
    assert not upward, "\n".join(upward)


def test_the_composition_root_imports_no_verb():
    targets = [t for _, t in imports(PACKAGE / "repo.py")]
    assert not [t for t in targets if t.startswith(("wvc.ops", "wvc.api", "wvc.view", "wvc.cli"))], targets


def test_the_store_reads_no_higher_layer_through_an_attribute():
    """The chunk supply is declared and passed in, not patched onto the store afterwards."""
    for path in SOURCES:
        assert "fetch_missing" not in path.read_text(), path


SQL = re.compile(r"\b(SELECT\s|INSERT\s|UPDATE\s+\w+\s+SET|DELETE\s+FROM|PRAGMA\s|CREATE\s+TABLE)", re.I)


@pytest.mark.parametrize("path", sorted((PACKAGE / "ops").rglob("*.py")) + [PACKAGE / "repo.py", PACKAGE / "api.py"],
                         ids=lambda p: p.name)
def test_no_sql_outside_the_store(path):
    text = path.read_text()
    found = [line.strip() for line in text.splitlines() if SQL.search(line) or ".conn." in line or ".execute(" in line]
    assert not found, found
