"""Tree diffs: a tree as the chunk ids that changed, at their places, in another tree.

A training step changes chunk ids and nothing else (same files, tensors, shapes), and most
often few of them: 1% of a 250,000-chunk model's. Two formats carry such a tree as a diff:

- a follower's step record (remotes/step_records.py) carries its commit's tree as a diff of the
  parent's tree;
- a remote catalog (remotes/catalog.py) may store a tree as a **tree delta**: the bytes
  ``DELTA_MAGIC`` + canonical JSON ``{"base": <tree id>, "changes": [[path, tensor | null,
  chunk index, chunk id], ...]}``. A reader resolves the chain of bases down to a whole tree
  (at most ``MAX_DELTA_DEPTH`` deltas) and checks every tree it builds against its id, so a
  delta is no more trusted than a whole tree. docs/design.md, "Tree deltas".

No I/O here: :func:`resolve` takes the lookups it needs.
"""

from __future__ import annotations

import json

from .. import ids
from ..errors import CorruptObject, FormatError
from .versions import MAX_TREE_BYTES, FileEntry, Tree, TensorEntry, canonical_json

DELTA_MAGIC = b"WVCTREEDELTA\x01\n"
MAX_DELTA_DEPTH = 64  # deltas between a stored tree and the whole tree it is read from
MAX_CHANGES = 1 << 22  # chunk places a diff may name (a tree holds at most ~2M chunk ids: MAX_TREE_BYTES)


def places(tree: Tree) -> dict[tuple[str, str | None, int], str]:
    """Each chunk's place in a tree: (path, tensor name or None for a blob, index) -> id."""
    out = {}
    for f in tree.files:
        if f.kind == "blob":
            out.update(((f.path, None, i), c) for i, c in enumerate(f.chunks))
        for t in f.tensors:
            out.update(((f.path, t.name, i), c) for i, c in enumerate(t.chunks))
    return out


def diff_trees(old: Tree, new: Tree) -> list | None:
    """``new`` as chunk-id changes of ``old``, or None when more than chunk ids changed
    (files, shapes, dtypes, headers, sizes): then the whole tree is carried instead."""
    if len(old.files) != len(new.files) or (old.format, old.chunk_bytes) != (new.format, new.chunk_bytes):
        return None
    changes = []
    for a, b in zip(old.files, new.files):
        if (a.path, a.kind, a.size, a.header, a.executable, len(a.chunks), len(a.tensors)) != \
                (b.path, b.kind, b.size, b.header, b.executable, len(b.chunks), len(b.tensors)):
            return None
        changes += [[a.path, None, i, y] for i, (x, y) in enumerate(zip(a.chunks, b.chunks)) if x != y]
        for s, t in zip(a.tensors, b.tensors):
            if (s.name, s.dtype, s.shape, len(s.chunks)) != (t.name, t.dtype, t.shape, len(t.chunks)):
                return None
            changes += [[a.path, s.name, i, y] for i, (x, y) in enumerate(zip(s.chunks, t.chunks)) if x != y]
    if apply_diff(old, changes).id != new.id:  # (a format-1 tree's file hashes: not a chunk-id change after all)
        return None
    return changes


def apply_diff(old: Tree, changes: list) -> Tree:
    """``old`` with the chunk ids of ``changes`` replaced (the caller checks the result's id)."""
    by_file: dict[str, list] = {}
    for path, tensor, index, chunk in changes:
        by_file.setdefault(path, []).append((tensor, index, chunk))
    files = list(old.files)
    where = {f.path: k for k, f in enumerate(files)}
    for path, edits in by_file.items():
        if path not in where:
            raise ValueError(f"the diff names a file the tree lacks: {path!r}")
        f = files[where[path]]
        blob = list(f.chunks)
        tensors = {t.name: list(t.chunks) for t in f.tensors}
        for tensor, index, chunk in edits:
            target = blob if tensor is None else tensors.get(tensor)
            if target is None or index >= len(target):
                raise ValueError("the diff names a chunk the tree lacks")
            target[index] = chunk
        listing = {"chunks": tuple(blob)} if f.kind == "blob" else {
            "header": f.header, "tensors": tuple(TensorEntry(t.name, t.dtype, t.shape, tuple(tensors[t.name]))
                                                 for t in f.tensors)}
        # (a format-1 tree's file hashes are digests of the bytes: the result's id then differs,
        # and diff_trees gives the whole tree instead)
        files[where[path]] = FileEntry.of(f.path, f.kind, f.size, executable=f.executable, **listing)
    return Tree(tuple(files), old.chunk_bytes, old.format)


def check_changes(changes, limit: int = MAX_CHANGES) -> list:
    """An untrusted diff's shape checked: a list of [path, tensor | None, index >= 0, chunk id]."""
    if not isinstance(changes, list) or len(changes) > limit:
        raise ValueError("bad tree diff")
    for change in changes:
        if not isinstance(change, list) or len(change) != 4:
            raise ValueError("bad tree diff entry")
        path, tensor, index, chunk = change
        if not isinstance(path, str) or not (tensor is None or isinstance(tensor, str)) \
                or type(index) is not int or index < 0 or not ids.is_object_id(chunk):
            raise ValueError("bad tree diff entry")
    return changes


# -- tree deltas (a remote catalog's stored form of a tree) --------------------------------------
def encode_delta(base: str, changes: list) -> bytes:
    return DELTA_MAGIC + canonical_json({"base": base, "changes": changes})


def is_delta(data: bytes) -> bool:
    return data[: len(DELTA_MAGIC)] == DELTA_MAGIC


def parse_delta(data: bytes, where: str) -> tuple[str, list]:
    """(base tree id, changes) of a stored tree delta (untrusted: bounded, every field checked)."""
    if not is_delta(data) or len(data) > MAX_TREE_BYTES:
        raise CorruptObject(f"{where} is not a tree delta of at most {MAX_TREE_BYTES >> 20} MiB")
    try:
        raw = json.loads(data[len(DELTA_MAGIC):])
        if not isinstance(raw, dict) or set(raw) != {"base", "changes"} or not ids.is_object_id(raw["base"]):
            raise ValueError("unexpected fields")
        return raw["base"], check_changes(raw["changes"])
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptObject(f"{where} is a malformed tree delta ({str(exc)[:120]})") from exc


HEAD_BYTES = 200  # what tells a stored tree's form and a delta's base: the magic and ``{"base":"<id>"``


def merge_forms(trees: dict[str, bytes], more: dict[str, bytes]) -> None:
    """Add the stored forms ``more`` (one segment's trees) to ``trees`` (merged over a
    remote's segments): a whole tree wins over a delta, since several segments may hold the
    same tree (a version seen before and pushed again by a wvc that stored it a second time,
    as a delta whose chain came back to itself; docs/design.md, "Tree deltas"), and a whole
    one always resolves."""
    for tree_id, data in more.items():
        if tree_id not in trees or (is_delta(trees[tree_id]) and not is_delta(data)):
            trees[tree_id] = data


def looping(trees: dict[str, bytes]) -> set[str]:
    """The trees of ``trees`` (stored forms, by id) whose chain of delta bases comes back to
    itself or runs deeper than MAX_DELTA_DEPTH: what no reader can resolve from these forms.
    A base ``trees`` lacks ends a chain (another store may hold it). Reads only each delta's
    head; each tree is walked once."""
    verdict: dict[str, bool] = {}
    for start in trees:
        walk: list[str] = []
        cursor, bad = start, False
        while cursor not in verdict:
            data = trees.get(cursor)
            if data is None or not is_delta(data):
                bad = False
                break
            if cursor in walk or len(walk) > MAX_DELTA_DEPTH:
                bad = True
                break
            walk.append(cursor)
            cursor = base_of(data, cursor)
        else:
            bad = verdict[cursor]
        # (each tree of a chain that reaches a resolvable one resolves: within the depth
        # limit too, unless the walk was cut short there, which then says so)
        for tid in walk:
            verdict[tid] = bad
    return {tid for tid, bad in verdict.items() if bad}


def chain(tree_id: str, head, limit: int = MAX_DELTA_DEPTH) -> tuple[int, int]:
    """(deltas, their bytes) between stored tree ``tree_id`` and the whole tree it is read from;
    ``head(id)``: (stored size, at least the first HEAD_BYTES of it) or None where no tree is
    stored (counted as whole). What a writer weighs before storing another delta on top: it
    stops past ``limit`` (and never parses a delta's changes)."""
    depth = size = 0
    found = head(tree_id)
    while found is not None and is_delta(found[1]) and depth <= limit:
        depth, size = depth + 1, size + found[0]
        found = head(base_of(found[1], tree_id))
    return depth, size


_BASE_AT = len(DELTA_MAGIC) + len(b'{"base":"')


def base_of(data: bytes, tree_id: str) -> str:
    """A delta's base from its first HEAD_BYTES, its changes unparsed: canonical JSON puts
    ``base`` first (anything else is parsed whole, and refused if it is not a delta)."""
    base = data[_BASE_AT : _BASE_AT + 64].decode("ascii", "replace")
    if data[len(DELTA_MAGIC) : _BASE_AT] == b'{"base":"' and ids.is_object_id(base) \
            and data[_BASE_AT + 64 : _BASE_AT + 66] == b'",':
        return base
    return parse_delta(data, f"tree {ids.short(tree_id)}")[0]


def resolve(tree_id: str, stored, known, where: str = "remote") -> tuple[Tree, list[tuple[str, Tree]]]:
    """Tree ``tree_id`` from stored forms, and the trees built on the way (for a cache).

    ``stored(id)``: the stored bytes (a whole tree's canonical bytes or a delta) or None;
    ``known(id)``: a Tree verified before, or None. Every tree built is checked against its id;
    a chain deeper than ``MAX_DELTA_DEPTH`` (a loop among them) is refused."""
    pending: list[tuple[str, list]] = []
    built: list[tuple[str, Tree]] = []
    walked: set[str] = set()
    cursor = tree_id
    while (tree := known(cursor)) is None:
        if cursor in walked:
            raise CorruptObject(f"{where} tree {ids.short(tree_id)} is stored as deltas that loop back to tree "
                                f"{ids.short(cursor)} (a version pushed again by an older wvc); a push "
                                f"from a clone that holds it repairs the remote")
        walked.add(cursor)
        data = stored(cursor)
        if data is None:
            raise CorruptObject(f"{where} is missing tree {ids.short(cursor)}" +
                                (f" (the base of tree {ids.short(pending[-1][0])})" if pending else ""))
        if not is_delta(data):
            try:
                tree = Tree.from_bytes(data, cursor)
            except FormatError as exc:
                raise CorruptObject(f"{where} tree {ids.short(cursor)} is corrupt: {exc}") from exc
            built.append((cursor, tree))
            break
        if len(pending) >= MAX_DELTA_DEPTH:
            raise CorruptObject(f"{where} tree {ids.short(tree_id)} is more than {MAX_DELTA_DEPTH} deltas deep")
        base, changes = parse_delta(data, f"{where} tree {ids.short(cursor)}")
        pending.append((cursor, changes))
        cursor = base
    for tid, changes in reversed(pending):
        try:
            tree = apply_diff(tree, changes)
        except ValueError as exc:
            raise CorruptObject(f"{where} tree delta {ids.short(tid)}: {exc}") from exc
        if tree.id != tid:
            raise CorruptObject(f"{where} tree delta {ids.short(tid)} does not give its id")
        built.append((tid, tree))
    return tree, built


def remember(cache, built: list[tuple[str, Tree]]) -> None:
    """Keep the trees :func:`resolve` built in ``cache`` (an ``LRUCache``), their canonical
    bytes dropped (a chain's trees share their chunk ids)."""
    for tid, tree in built:
        cache.put(tid, tree.forget_bytes())
