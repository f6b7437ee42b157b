"""remotes/rebase_plan.py: which chunks a remote takes as the local store holds them at a prune,
so that every live step payload keeps the context it was coded in (its base's base)."""

from wvc.codec.container import Method
from wvc.remotes.rebase_plan import Rep, plan, stored_bytes

STEP, PLAIN, KEY = int(Method.STEP_BLOCKS), int(Method.ULP_EXP), int(Method.PLANES)


def reps(table: dict):
    return lambda oid: table.get(oid)


def test_a_chunk_re_encoded_here_onto_a_kept_base_is_taken_and_frees_the_chain_it_ran_through():
    # the remote: x on p (pruned) on k (keyframe); here x was re-encoded onto k
    remote = {"x": Rep("p", PLAIN, 100), "p": Rep("k", PLAIN, 100), "k": Rep(None, KEY, 1000)}
    local = {"x": Rep("k", PLAIN, 150), "k": Rep(None, KEY, 1000)}
    taken, live = plan({"x"}, reps(remote), reps(local))
    assert taken == {"x": Rep("k", PLAIN)} and live == {"x", "k"}
    assert stored_bytes(live, taken, reps(remote)) == 1150 < stored_bytes({"x", "p", "k"}, {}, reps(remote))


def test_a_step_payload_whose_base_would_move_keeps_that_base_where_it_was():
    # y is a step on b in the context of b's base a; here b was re-encoded onto k but y was not
    # (a step record names y's payload): taking b would decode y in the context of k
    remote = {"y": Rep("b", STEP), "b": Rep("a", PLAIN), "a": Rep("k", PLAIN), "k": Rep(None, KEY)}
    local = {"y": Rep("b", STEP), "b": Rep("k", PLAIN), "a": Rep("k", PLAIN), "k": Rep(None, KEY)}
    taken, live = plan({"y"}, reps(remote), reps(local))
    assert taken == {} and live == {"y", "b", "a", "k"}


def test_a_step_payload_taken_needs_its_coding_context_under_it():
    # here y is a step on b coded in the context of k (b's base here); the remote keeps b on a
    # (b is left as it is), so y's local payload cannot go up; taking both is consistent
    remote = {"y": Rep("b", PLAIN), "b": Rep("a", PLAIN), "a": Rep("k", PLAIN), "k": Rep(None, KEY)}
    local = {"y": Rep("b", STEP), "b": Rep("k", PLAIN), "k": Rep(None, KEY)}
    taken, _ = plan({"y"}, reps(remote), reps(local), keep_as_is={"b"})
    assert taken == {}
    taken, live = plan({"y"}, reps(remote), reps(local))
    assert taken == {"y": Rep("b", STEP), "b": Rep("k", PLAIN)} and live == {"y", "b", "k"}


def test_a_base_only_this_store_holds_goes_up_with_what_needs_it_or_nothing_does():
    remote = {"x": Rep("p", PLAIN), "p": Rep(None, KEY)}
    local = {"x": Rep("z", PLAIN), "z": Rep(None, KEY)}
    taken, live = plan({"x"}, reps(remote), reps(local))
    assert taken == {"x": Rep("z", PLAIN), "z": Rep(None, KEY)} and live == {"x", "z"}
    taken, live = plan({"x"}, reps(remote), reps(local), keep_as_is={"z"})
    assert taken == {} and live == {"x", "p"}


def test_a_method_this_wvc_does_not_know_is_taken_to_need_its_context():
    remote = {"y": Rep("b", 99), "b": Rep("a", PLAIN), "a": Rep(None, KEY), "k": Rep(None, KEY)}
    local = {"b": Rep("k", PLAIN), "k": Rep(None, KEY)}
    taken, _ = plan({"y"}, reps(remote), reps(local))
    assert taken == {}


def test_a_rewrite_of_segments_that_keep_commits_and_no_chunk_writes_no_pack(tmp_path):
    """A prune's rewrite can cut only segments whose chunks all went (pruned versions' pushes):
    the merged segment is their commits and trees, with no pack (an empty pack writer failed
    the prune), and no pack is downloaded for them."""
    from wvc.remotes import compaction
    from wvc.remotes.catalog import Catalog
    from wvc.remotes.repository import Segment

    def download(name, dest):
        raise AssertionError(f"downloaded {name} for no chunk")

    old = [Segment("c" * 64, "a" * 64, [], {"1" * 64: b"commit"}, {"2" * 64: b"tree"})]
    pack, catalog, recipe = compaction.merge_segments(download, old, None, Catalog(None), tmp_path)
    assert pack is None and recipe is None and catalog.pack is None
    assert catalog.commits == {"1" * 64: b"commit"} and catalog.trees == {"2" * 64: b"tree"}
