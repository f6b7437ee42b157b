"""The commit graph (store/graph.py): walks are iterative, merge bases are deterministic."""

from wvc import Repo
from wvc.model.versions import Commit, Tree


def _graph_with(tmp_path, edges: dict[str, tuple[str, ...]]):
    """A repository whose graph holds commits named by ``edges`` (name -> parent names),
    inserted parents first; returns (graph, name -> id)."""
    repo = Repo.init(tmp_path / "g")
    tree = Tree((), 4096)
    made: dict[str, str] = {}
    with repo.internals.db.write():
        repo.internals.graph.add_tree(tree)
        for t, name in enumerate(edges):
            c = Commit(tree.id, tuple(made[p] for p in edges[name]), "t", t, name, {})
            made[name] = repo.internals.graph.add_commit(c, 0)
    return repo, made


def test_walks_of_a_long_history_do_not_recurse(tmp_path):
    edges = {"c0": ()}
    edges.update({f"c{i}": (f"c{i - 1}",) for i in range(1, 5000)})
    repo, ids = _graph_with(tmp_path, edges)
    assert len(repo.internals.graph.ancestors(ids["c4999"])) == 5000
    assert repo.internals.graph.is_ancestor(ids["c0"], ids["c4999"])
    assert not repo.internals.graph.is_ancestor(ids["c4999"], ids["c0"])
    assert len(repo.log(ids["c4999"])) == 5000


def test_merge_base_of_a_fork_and_of_a_criss_cross(tmp_path):
    # root - a - b (ours), root - a - c (theirs): the fork point is a
    repo, ids = _graph_with(tmp_path, {"root": (), "a": ("root",), "b": ("a",), "c": ("a",)})
    assert repo.internals.graph.merge_bases(ids["b"], ids["c"]) == [ids["a"]]
    assert repo.internals.graph.merge_bases(ids["b"], ids["a"]) == [ids["a"]]  # one side contains the other


def test_criss_cross_merge_bases_are_all_listed_in_one_order_everywhere(tmp_path):
    # x and y both merge p and q: p and q are both best common ancestors of x and y
    edges = {"root": (), "p": ("root",), "q": ("root",), "x": ("p", "q"), "y": ("q", "p")}
    repo, ids = _graph_with(tmp_path, edges)
    bases = repo.internals.graph.merge_bases(ids["x"], ids["y"])
    assert set(bases) == {ids["p"], ids["q"]}
    assert bases == repo.internals.graph.merge_bases(ids["y"], ids["x"])
    assert bases[0] == ids["q"]  # the newer one (timestamps 1 and 2) first
