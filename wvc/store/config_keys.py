"""Every key of a repository's ``config`` table (``.wvc/wvc.db``), in one place: what each
holds and who writes it. A key is named here once; modules import the name, never spell it.
"""

from __future__ import annotations

FORMAT = "format"  # "1", or "2" once a tree delta is stored (store/graph.py); a reader refuses others
CHUNK_BYTES = "chunk_bytes"  # the chunk size new files are split into (init)
MAX_CHAIN = "max_chain"  # how many deltas a chain may hold (init --max-chain)
HEAD = "HEAD"  # "ref: refs/heads/<branch>" or a commit id (store/refs.py)

# a repository on a base model (basemodel/): its URL (hf://org/name@<sha> or a directory),
# tree, root commit, and the directory its files are read from
BASE_URL = "base.url"
BASE_TREE = "base.tree"
BASE_COMMIT = "base.commit"
BASE_DIR = "base.dir"

LAZY_REMOTE = "lazy.remote"  # a lazy clone: the remote its chunks come from on first use
CLONE_INCOMPLETE = "clone.incomplete"  # a clone in progress (its URL): a rerun after a kill starts over

# a merge in progress: the other side's commit, and how it was merged (a merge written with
# --no-commit waits there for the next commit, which takes both; any checkout drops it)
MERGE_HEAD = "merge.head"
MERGE_RECIPE = "merge.recipe"

RETIRED_PACKS = "prune.retired"  # packs a prune's (or gc's) transaction dropped, until their files are gone


def remote_url_key(name: str) -> str:
    """The key of remote ``name``'s URL."""
    return f"remote.{name}.url"


REMOTE_URL_KEYS = "remote.%.url"  # (a LIKE pattern: every remote's URL key)


def remote_of_url_key(key: str) -> str:
    """The remote a :func:`remote_url_key` names."""
    return key[len("remote."):-len(".url")]
