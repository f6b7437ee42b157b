"""wvc: a Git-style, lossless version store for neural-network weights.

    import wvc
    repo = wvc.Repo.init("my-model")         # or wvc.Repo.open(".")
    repo.commit("step 100", metadata={"step": 100})
    repo.checkout("HEAD~1")
    weights = repo.load_state_dict("main", device="cuda")

Importing wvc does not import torch, nor the verbs (wvc/api.py) until one is asked for:
``wvc --help`` stays fast.
"""

from .errors import WvcError

__all__ = ["Repo", "TensorStream", "WvcError", "clone", "follow", "open", "snapshot_download", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("Repo", "clone"):
        from . import api

        return getattr(api, name)
    if name == "open":  # wvc.open(url_or_path, rev), as the spec names it
        from .read.view import open_version

        return open_version
    if name == "follow":  # apply each new version of a branch to a dict of tensors
        from .read.follower import follow

        return follow
    if name == "TensorStream":  # repo.commit(msg, TensorStream(pairs)): tensors one at a time
        from .worktree.chunking import TensorStream

        return TensorStream
    if name == "snapshot_download":  # a version as a plain directory, for from_pretrained
        from .read.view import snapshot_download

        return snapshot_download
    raise AttributeError(f"module 'wvc' has no attribute {name!r}")
