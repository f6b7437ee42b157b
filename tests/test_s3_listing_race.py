"""A push that lands between an S3 reader's listing and its reading of the refs is seen
whole (issue 37, finding 29: a pusher read a ref naming a commit whose catalog its listing
predated, failed with "remote is missing commit" and, against busy pushers and a gc loop,
starved)."""

from wvc import Repo, clone
from wvc.remotes import s3

from .conftest import new_bucket
from .test_everyday import two_tensors


def test_a_push_between_the_listing_and_the_refs_is_read_consistently(tmp_path, s3_env, monkeypatch):
    url = f"s3://{new_bucket()}/m"
    a = Repo.init(tmp_path / "a")
    two_tensors(a.root / "model.safetensors")
    a.commit("one")
    a.remote_add("origin", url)
    a.push()
    b = clone(url, tmp_path / "b")
    two_tensors(a.root / "model.safetensors", 5, 6)
    tip = a.commit("two").commit

    real_list = s3.S3Backend._list
    raced = []

    def list_then_race(self):
        listing = real_list(self)
        if not raced:  # once: the other pusher lands right after this reader's listing
            raced.append(True)
            a.push()
        return listing

    monkeypatch.setattr(s3.S3Backend, "_list", list_then_race)
    fetched = b.fetch()
    assert raced and fetched.refs["main"] == tip
    b.pull()
    assert b.head() == tip and b.fsck().ok
