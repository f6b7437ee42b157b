"""Error hierarchy.

Every failure a user can cause (bad input, unknown revision, refused operation) is a
:class:`WvcError`; the CLI prints its message as one line and exits non-zero. Classes are
rooted in stdlib types where one fits, so callers can catch what they understand
(``RevisionNotFound`` is also a ``LookupError``).
"""

from __future__ import annotations


class WvcError(Exception):
    """Base of every error wvc raises on purpose."""

    exit_code = 1


class NotARepository(WvcError, FileNotFoundError):
    """No ``.wvc`` directory at or above the given path."""


class RepositoryExists(WvcError, FileExistsError):
    """``init`` on a directory that already holds a repository."""


class FormatError(WvcError, ValueError):
    """Untrusted bytes (a file, an object, a manifest) failed validation."""


class SafetensorsFormatError(FormatError):
    """A ``.safetensors`` file is malformed; the message names the file and the defect."""


class CorruptObject(FormatError):
    """A stored object does not decode, or decodes to bytes whose hash is not its id."""


class PackMissing(CorruptObject):
    """A pack file a row points into is not there: damage, or rows read just before a gc or
    prune moved them to another pack and unlinked this one (reading the rows again tells)."""


class MissingObject(WvcError, LookupError):
    """An object referenced by a tree or a delta is not in the store."""


class RevisionNotFound(WvcError, LookupError):
    """A REV does not name a commit."""


class VersionPruned(WvcError, LookupError):
    """The version's weights were dropped by `wvc prune`; its commit stays in the log."""


class InvalidRefName(WvcError, ValueError):
    """A branch or tag name is not allowed."""


class RefExists(WvcError, FileExistsError):
    """Creating a branch or tag that exists already."""


class UncommittedChanges(WvcError):
    """An operation would overwrite work that is not committed."""


class ConcurrentUpdate(WvcError):
    """Something changed under an operation: a ref moved between reading it and updating it
    (another writer won), or a file changed while it was being committed."""


class StaleWrite(ConcurrentUpdate):
    """What a writer prepared was changed under it before its record, by a prune or gc in
    another process: a new chunk's delta base removed or re-encoded on another base, or its
    new pack removed (gc --grace 0). Nothing was recorded; encoding again succeeds."""


class UnsafePath(FormatError):
    """A path from a manifest or the working tree would escape the repository."""


class NothingToCommit(WvcError):
    """The working tree equals HEAD and ``--allow-empty`` was not given."""


class InvalidArgument(WvcError, ValueError):
    """A setting or argument out of its allowed range (``--chunk-size 4``, ``--device gpu``)."""

    exit_code = 2


class UnsupportedTensor(WvcError, TypeError):
    """A tensor wvc cannot store (a dtype with no safetensors name, such as complex64)."""


class DeviceUnavailable(WvcError):
    """``--device cuda`` on a machine where torch sees no usable GPU."""


class RemoteError(WvcError):
    """A remote is unreachable, refuses us, or holds something invalid."""


class RemoteFileTooLarge(RemoteError):
    """A remote file is larger than the reader allows for what it should be."""


class RemoteNotFound(RemoteError):
    """The remote repository does not exist (or, on the Hub, is not readable with our token)."""


class NotAWvcRemote(RemoteError):
    """A remote URL names something that holds other files (a plain model repository, a
    directory, a bucket) and no wvc history: wvc neither reads it as one nor writes into it."""


class NonFastForward(RemoteError):
    """A push or pull that would drop commits on one side."""


class RemoteChanged(RemoteError):
    """The remote's refs moved between reading them and publishing (a concurrent push)."""


class BaseModelError(WvcError):
    """A base model that cannot be resolved, downloaded or verified."""


class MissingEntry(WvcError, KeyError):
    """A file or tensor name that the version does not have."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DatabaseUnavailable(WvcError):
    """The repository database cannot be read: locked by another process, not readable by
    this user, or damaged. Never taken for a half-made repository."""


class LockedError(WvcError):
    """Another process holds a lock wvc waits for: the working-tree lock (a commit, checkout,
    pull or reset) or the database's write lock."""


class PathInTheWay(WvcError, FileExistsError):
    """A destination is not empty, or a directory stands where a file must go."""


class DetachedHead(WvcError):
    """The operation needs a branch and HEAD names a commit: name the branch."""


class BranchInUse(WvcError):
    """The branch is checked out, or holds commits no other branch has."""


class MergeInProgress(WvcError):
    """A merge written with --no-commit waits to be committed."""


class NoSuchRemote(RemoteError, LookupError):
    """No remote of that name is configured."""


class RemoteExists(WvcError, FileExistsError):
    """A remote of that name is configured already."""


class TransferNotInitialized(WvcError, RuntimeError):
    """A weight update asked of an engine whose wvc weight transfer was not initialized
    (a RuntimeError, as vLLM's own backends raise)."""


class EngineUnusable(WvcError):
    """An inference engine's weights were left part old, part new by an update that failed
    midway: it must be restarted (its outputs would be a silent mix of two versions)."""


class WeightSyncError(WvcError):
    """Inference servers did not all do what a sync asked (load a version, pause, resume):
    each one's URL and reason. Those that failed to load serve the version they had (or were
    marked unusable: their reason says so); the next sync moves them to its version."""

    def __init__(self, action: str, failures: dict, commit: str | None = None):
        self.action, self.failures, self.commit = action, dict(failures), commit
        lines = "; ".join(f"{url}: {reason}" for url, reason in self.failures.items())
        super().__init__(f"{len(self.failures)} server(s) did not {action}: {lines}")
