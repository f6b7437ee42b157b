"""wvc: a Git-style, lossless version store for neural-network weights.

    import wvc
    repo = wvc.Repo.init("my-model")         # or wvc.Repo.open(".")
    repo.commit("step 100", metadata={"step": 100})
    repo.checkout("HEAD~1")
    weights = repo.load_state_dict("main", device="cuda")

Importing wvc does not import torch.
"""

from .errors import WvcError
from .repo import Repo, clone
from .view import open_version as open  # noqa: A001 - wvc.open(url_or_path, rev), as the spec names it

__all__ = ["Repo", "WvcError", "clone", "open", "__version__"]
__version__ = "0.1.0"
