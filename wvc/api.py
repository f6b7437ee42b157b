"""The public Python API: ``wvc.Repo`` and ``wvc.clone``.

Every verb of the CLI is a method here with the same name, and each is one call into
:mod:`wvc.ops` (dulwich's ``porcelain`` over its ``repo``): the composition root
(wvc/repo.py) builds the parts, ``ops`` does the work, this module only names it.
Each verb imports its module when called, so ``wvc status`` loads status alone (and no
verb imports torch until it touches tensor bytes).
"""

from __future__ import annotations

from .progress import NULL, Progress
from .repo import DEFAULT_CHUNK_BYTES, Repository, remove_new_repository
from .store.chunk_writer import DEFAULT_MAX_CHAIN
from .store.config_keys import BASE_DIR
from .store.refs import HEADS, REMOTES, TAGS


class Repo:
    """A repository and its verbs: the public API.

    It is a facade over the internal repository (``wvc/repo.py``: the database, the chunk
    store, the commit graph and the refs it is made of): the verbs are its methods, and the
    queries a user (or a test of behaviour) asks are too: ``head()``, ``resolve(rev)``,
    ``read_commit(rev)``, ``tree_of(rev)``, ``is_pruned(rev)``. Writers that run beside a
    training loop (the Publisher, the TRL transfer, DCP's storage writer) use the methods of
    "Writers beside a training loop" below. ``internals`` reaches the parts, for tests of
    storage; they are no stable API."""

    def __init__(self, root):
        """The repository whose ``.wvc`` is in ``root`` (``Repo.open`` also looks above)."""
        self._repository = Repository(root)

    @classmethod
    def _over(cls, repository: Repository) -> "Repo":
        repo = cls.__new__(cls)
        repo._repository = repository
        return repo

    @classmethod
    def open(cls, path=".") -> "Repo":
        """The repository at ``path`` or the nearest directory above it."""
        return cls._over(Repository.open(path))

    @classmethod
    def init(cls, path=".", *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_chain: int = DEFAULT_MAX_CHAIN,
             branch: str = "main", base: str | None = None, progress: Progress = NULL) -> "Repo":
        """Create ``.wvc/`` in ``path``. ``base`` (hf://org/name[@rev] or a directory) becomes
        the root of history, referenced in place (wvc/basemodel/); on any failure nothing is left."""
        from pathlib import Path

        created_root = not Path(path).exists()
        repository = Repository.create(path, chunk_bytes=chunk_bytes, max_chain=max_chain, branch=branch)
        if base is not None:
            from .basemodel.setup import set_base

            try:
                set_base(repository, base, progress=progress)
            except BaseException:
                repository.close()
                remove_new_repository(repository.root, created_root)
                raise
        return cls._over(repository)

    # -- the repository itself ---------------------------------------------------------------
    @property
    def internals(self) -> Repository:
        """The internal repository (store, graph, refs, db): not a stable API."""
        return self._repository

    def close(self) -> None:
        """Release the database and the pack files (also on leaving a ``with`` block)."""
        self._repository.close()

    def __enter__(self) -> "Repo":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    @property
    def root(self):
        """The working tree's directory (``.wvc`` is in it)."""
        return self._repository.root

    @property
    def chunk_bytes(self) -> int:
        """The chunk size new files are split into (a tree keeps the one it was made with)."""
        return self._repository.chunk_bytes

    @property
    def max_chain(self) -> int:
        """How many deltas a chain may hold before a chunk is stored whole again."""
        return self._repository.max_chain

    def base(self):
        """The base model this history starts from (a BaseRef), or None."""
        return self._repository.base()

    def base_dir(self):
        """Where the base model's files are on this machine (a Path; for a Hub base, its
        snapshot in huggingface_hub's cache), or None without a base."""
        from pathlib import Path

        found = self._repository.db.get_config(BASE_DIR)
        return Path(found) if found else None

    @property
    def lazy_downloaded(self) -> int:
        """Bytes a lazy clone has fetched on first use in this process."""
        return self._repository.lazy_downloaded

    # -- queries -------------------------------------------------------------------------------
    def head(self) -> str | None:
        """The commit HEAD points at (None in a repository with no commit yet)."""
        return self._repository.refs.head_commit()

    def head_branch(self) -> str | None:
        """HEAD's branch, or None when HEAD is detached."""
        return self._repository.refs.head_branch()

    def resolve(self, rev: str) -> str:
        """The commit id a REV names (a branch, tag, id prefix, HEAD~2, main@{1}, ...)."""
        return self._repository.resolve(rev)

    def read_commit(self, rev: str):
        """The commit (id, tree, parents, message, metadata) a REV names."""
        return self._repository.read_commit(self._repository.resolve(rev))

    def tree_of(self, rev: str, *, weights: bool = True):
        """The tree (the version's files, tensors and chunk ids) of the commit ``rev`` names.
        ``weights``: a version `wvc prune` dropped is refused (VersionPruned); False: its
        listing is wanted, not its bytes."""
        return self._repository.tree_of(rev, weights=weights)

    def is_pruned(self, rev: str) -> bool:
        """Whether `wvc prune` dropped the weights of the version ``rev`` names."""
        return self._repository.graph.is_pruned(self._repository.resolve(rev))

    def pruned(self) -> set[str]:
        """The ids of every commit whose weights `wvc prune` dropped."""
        return self._repository.graph.pruned()

    def has_commit(self, commit_id: str) -> bool:
        """Whether the commit ``commit_id`` (a full id) is in this repository."""
        return self._repository.graph.has_commit(commit_id)

    def branch_tip(self, branch: str, remote: str | None = None) -> str | None:
        """The commit ``branch`` points at, or None when there is no such branch. ``remote``:
        that remote's branch, as this repository last saw it (its remote-tracking branch)."""
        return self._repository.refs.get(f"{REMOTES}{remote}/{branch}" if remote else HEADS + branch)

    def ancestors(self, commits, *, stop=frozenset()) -> list[str]:
        """``commits`` (an id or several) and every commit they descend from that is here,
        not walking past the commits in ``stop``."""
        return self._repository.graph.ancestors(commits, stop=frozenset(stop))

    def first_parent_history(self, rev: str = "HEAD", limit: int | None = None) -> list[str]:
        """The commits from ``rev`` back along first parents, oldest first (the last ``limit``)."""
        from .ops.changes import first_parent_history

        return first_parent_history(self._repository, rev, limit)

    def stored_bytes(self, commit_id: str) -> int | None:
        """The bytes ``commit_id`` added to the store when it was recorded (None: not known,
        e.g. a commit fetched without its weights)."""
        return self._repository.graph.stored_bytes(commit_id)

    # -- each commit's change against its first parent, kept (ops/changes.py) ---------------------
    def tensor_changes(self, commit_id: str):
        """The kept per-tensor changes of ``commit_id`` against its first parent
        (``TensorChange``: relative L2, fraction and ULPs changed, stored bytes); refused
        (RevisionNotFound) until :meth:`compute_tensor_changes` has computed them."""
        from .ops.changes import changes_of

        return changes_of(self._repository, commit_id)

    def missing_tensor_changes(self, commits) -> list[str]:
        """Those of ``commits`` whose changes are not computed yet, in order."""
        from .ops.changes import missing_changes

        return missing_changes(self._repository, commits)

    def compute_tensor_changes(self, commits, progress: Progress = NULL) -> int:
        """Compute and keep the changes of those of ``commits`` that lack them; returns how many
        were computed (what ``wvc ui`` does before it serves, since its server never writes)."""
        from .ops.changes import ensure_changes

        return ensure_changes(self._repository, commits, progress)

    # -- writers beside a training loop ----------------------------------------------------------
    @property
    def wvc_dir(self):
        """The repository's own folder (``.wvc`` in the working tree)."""
        return self._repository.wvc_dir

    def set_head_branch(self, branch: str, reason: str) -> None:
        """Point HEAD at ``branch`` (which need not exist yet) without touching the working
        tree: a staging repository commits onto another branch than the one it publishes."""
        self._repository.refs.set_head("ref: " + HEADS + branch, reason)

    def keep_recent_chunks(self, max_bytes: int) -> None:
        """Keep the raw chunks of recent commits in memory (up to ``max_bytes``) for the next
        commit's deltas and step payloads: a writer that commits every training step decodes
        no chain (store/chunks.py, ``keep_recent``)."""
        self._repository.store.keep_recent(max_bytes)

    def share_kept_chunks(self, writer: "Repo") -> None:
        """Read what ``writer`` (another Repo of this repository, on another thread) keeps
        in memory: a pusher then sends the step payloads the committer coded."""
        self._repository.store.read_kept_of(writer._repository.store)

    def read_chunk(self, chunk_id: str) -> bytes:
        """A stored chunk's bytes, decoded and verified against its id."""
        return self._repository.store.get(chunk_id)

    def read_chunks(self, chunk_ids):
        """Stored chunks' bytes in the order of ``chunk_ids``, decoded ahead on the codec pool."""
        return self._repository.store.get_many(chunk_ids)

    def chunk_writer(self, *, device: str = "cpu", max_chain: int | None = None):
        """A writer of new chunks into one new pack (a context manager; ``finish()`` gives the
        pack and its rows for :meth:`record_commit`): DCP's ranks each write their shards."""
        kwargs = {} if max_chain is None else {"max_chain": max_chain}
        return self._repository.store.writer(device=device, **kwargs)

    def record_commit(self, commit, tree, stored_bytes: int, *, packs, branch: str, expected: str | None,
                      reason: str) -> None:
        """Record ``commit`` (its ``tree`` and the ``packs`` the chunk writers finished) and
        move ``branch`` to it if it still points at ``expected`` (else nothing is recorded:
        compare and swap); the working tree is refreshed when ``branch`` is HEAD's."""
        self._repository.record([(commit, tree, stored_bytes)], packs=packs, ref=HEADS + branch, expected=expected,
                                reason=reason)
        if branch == self.head_branch():
            from .worktree.refresh import refresh_worktree

            parent_tree = self._repository.tree_of(expected, weights=False) if expected else None
            refresh_worktree(self._repository, parent_tree, tree)

    # -- verbs -----------------------------------------------------------------------------
    def status(self):
        """Which files of the working tree differ from HEAD (modified, deleted, new), and what was skipped."""
        from .ops import status

        return status.status(self._repository)

    def commit(self, message: str | None, source=None, *, author: str | None = None, metadata: dict | None = None,
               allow_empty: bool = False, device: str = "auto", state_dict_path: str = "model.safetensors",
               branch: str | None = None, exclude: tuple[str, ...] = (), amend: bool = False,
               progress: Progress = NULL):
        """Commit the working tree, another directory, a state dict, or a ``TensorStream``
        of (name, tensor) pairs taking the place of the parent's tensors one at a time (``source``).

        ``metadata``: JSON stored with the commit (step, loss, ...); ``allow_empty``: commit
        even if nothing changed; ``device``: where deltas are computed (auto, cpu, cuda);
        ``state_dict_path``: the file a state dict is stored as; ``branch``: commit onto that
        branch (created from HEAD if missing) without checking it out; ``exclude``:
        gitignore-style patterns for a directory source; ``amend``: replace HEAD's commit.
        Onto HEAD's branch, the working tree is refreshed to a commit it was not the source of."""
        from .ops import commit

        return commit.commit(self._repository, message, source, author=author, metadata=metadata, allow_empty=allow_empty,
                             device=device, state_dict_path=state_dict_path, branch=branch, exclude=exclude,
                             amend=amend, progress=progress)

    def checkout(self, rev: str, *, force: bool = False, output=None, paths=None, progress: Progress = NULL):
        """Switch to ``rev``; or write it into ``output``; or restore ``paths`` from it (HEAD stays)."""
        from .ops import checkout

        return checkout.checkout(self._repository, rev, force=force, output=output, paths=paths, progress=progress)

    def reset(self, rev: str, *, mode: str = "mixed", progress: Progress = NULL):
        """Move the current branch to ``rev`` (``hard``: the working tree too; see ops/reset.py)."""
        from .ops import reset

        return reset.reset(self._repository, rev, mode=mode, progress=progress)

    def reflog(self, ref: str = "HEAD", n: int | None = None):
        """Where ``ref`` (HEAD, a branch or tag name) pointed, newest first."""
        from .ops import history

        return history.reflog(self._repository, ref, n)

    def log(self, rev: str = "HEAD", n: int | None = None, all_refs: bool = False, *, exclude=(), paths=()):
        """Commits reachable from ``rev`` (``A..B`` as in git), newest first; ``exclude``: REVs
        whose history is left out (git's ``^REV``); ``paths``: only commits that changed them."""
        from .ops import history

        return history.log(self._repository, rev, n, all_refs, exclude=exclude, paths=paths)

    def changed_files(self, rev: str = "HEAD") -> list[dict]:
        """What commit ``rev`` changed against its first parent: each file's path, status and
        sizes (``log --stat``, ``show --stat``)."""
        from .ops import history

        return history.changed_files(self._repository, self._repository.resolve(rev))

    def _repr_html_(self) -> str:
        """A notebook's view: the last commits of HEAD's history (``wvc ui`` draws the rest)."""
        from html import escape

        rows = "".join(f"<tr><td><code>{e.id[:10]}</code></td><td>{escape(', '.join(e.refs))}</td>"
                       f"<td>{escape(e.message.splitlines()[0] if e.message else '')}</td>"
                       f"<td>{escape(str(e.metadata)[:120])}</td><td>{e.stored_bytes if e.stored_bytes is not None else '-'}</td></tr>"
                       for e in (self.log(n=10) if self.head() else []))
        return (f"<p>wvc repository <code>{escape(str(self.root))}</code> on {escape(self.head_branch() or 'a detached HEAD')}"
                f"</p><table><tr><th>commit</th><th>refs</th><th>message</th><th>metadata</th><th>stored bytes</th></tr>"
                f"{rows}</table>")

    def show(self, rev: str = "HEAD"):
        """One commit as a dict: id, tree, parents, author, time, message, metadata, sizes and files."""
        from .ops import history

        return history.show(self._repository, rev)

    def diff(self, rev_a: str | None = None, rev_b: str | None = None, *, stat: bool = False, paths=(),
             progress: Progress = NULL):
        """Per-file and per-tensor changes from ``rev_a`` (default HEAD) to ``rev_b`` (default
        the working tree); ``stat``: files only; ``paths``: only files at or under these."""
        from .ops import diff

        return diff.diff(self._repository, rev_a, rev_b, stat=stat, paths=paths, progress=progress)

    def merge(self, rev: str, *, strategy: str | None = None, weights: tuple[float, float] = (0.5, 0.5),
              density: float = 1.0, lam: float = 1.0, seed: int = 0, t: float = 0.5, no_commit: bool = False,
              message: str | None = None, progress: Progress = NULL):
        """Three-way merge of ``rev`` into HEAD (docs/merge.md); conflicts refuse it unless a
        ``strategy`` (ours, theirs, linear, task-arithmetic, ties, dare-linear, dare-ties, slerp)
        settles them."""
        from .model.merge_methods import MergeParameters
        from .ops import merge

        params = MergeParameters(weights[0], weights[1], density, lam, seed, t)
        return merge.merge(self._repository, rev, strategy=strategy, params=params, no_commit=no_commit, message=message,
                           progress=progress)

    def export(self, rev: str, out_dir, *, max_shard_bytes: int = 5_000_000_000, progress: Progress = NULL):
        """``rev`` (a DCP commit, or any) as HF-style sharded safetensors in ``out_dir``."""
        from .ops import export

        return export.export(self._repository, rev, out_dir, max_shard_bytes=max_shard_bytes, progress=progress)

    def load_state_dict(self, rev: str = "HEAD", *, device: str = "cpu", lazy: bool = False):
        """Every tensor of version ``rev`` by name, on ``device`` (``lazy``: decoded on first access)."""
        from .read import tensors

        return tensors.load_state_dict(self._repository, rev, device=device, lazy=lazy)

    def branches(self) -> dict[str, str]:
        """Local branches: name -> commit id."""
        return self._repository.refs.list(HEADS)

    def create_branch(self, name: str, start: str = "HEAD") -> str:
        """Create branch ``name`` at ``start`` (HEAD stays where it is); returns its commit."""
        from .ops import branches

        return branches.create_ref(self._repository, HEADS, name, start, "branch")

    def delete_branch(self, name: str, *, force: bool = False) -> str:
        """Delete a branch; one HEAD does not contain is refused unless ``force``."""
        from .ops import branches

        return branches.delete_branch(self._repository, name, force)

    def rename_branch(self, old: str, new: str) -> str:
        """Rename branch ``old`` to ``new``; HEAD follows it if it was on ``old``. Returns its commit."""
        from .ops import branches

        return branches.rename_branch(self._repository, old, new)

    def force_branch(self, name: str, start: str = "HEAD") -> tuple[str | None, str]:
        """Create ``name`` or move it to ``start`` (not the current branch: see reset)."""
        from .ops import branches

        return branches.force_branch(self._repository, name, start)

    def tags(self) -> dict[str, str]:
        """Tags: name -> commit id."""
        return self._repository.refs.list(TAGS)

    def create_tag(self, name: str, rev: str = "HEAD") -> str:
        """Tag ``rev`` as ``name`` (a tag never moves unless deleted); returns its commit."""
        from .ops import branches

        return branches.create_ref(self._repository, TAGS, name, rev, "tag")

    def delete_tag(self, name: str) -> str:
        """Delete tag ``name``; returns the commit it named."""
        from .ops import branches

        return branches.delete_tag(self._repository, name)

    # -- remotes ---------------------------------------------------------------------------
    def remotes(self) -> dict[str, str]:
        """Configured remotes: name -> URL."""
        from .ops import remote_config

        return remote_config.remotes(self._repository)

    def remote_add(self, name: str, url: str) -> None:
        """Add remote ``name`` at ``url`` (hf://org/name, hf://org/name@rev, s3://bucket/prefix, a directory)."""
        from .ops import remote_config

        remote_config.remote_add(self._repository, name, url)

    def remote_remove(self, name: str) -> None:
        """Remove remote ``name`` and its remote-tracking branches."""
        from .ops import remote_config

        remote_config.remote_remove(self._repository, name)

    def remote_rename(self, old: str, new: str) -> None:
        """Rename a remote (its remote-tracking branches follow)."""
        from .ops import remote_config

        remote_config.remote_rename(self._repository, old, new)

    def remote_set_url(self, name: str, url: str) -> None:
        """Point remote ``name`` at another URL."""
        from .ops import remote_config

        remote_config.remote_set_url(self._repository, name, url)

    def remote_branches(self) -> dict[str, str]:
        """Remote-tracking branches (what the last fetch saw): "origin/main" -> commit id."""
        return self._repository.refs.list(REMOTES)

    def push(self, remote: str = "origin", branch: str | None = None, *, force: bool = False, tags: bool = False,
             progress: Progress = NULL):
        """Push ``branch`` (HEAD's by default; a tag name pushes the tag), and with ``tags``
        every tag."""
        from .ops import push

        return push.push(self._repository, remote, branch, force=force, tags=tags, progress=progress)

    def delete_remote_branch(self, remote: str, name: str) -> dict:
        """Delete branch (or tag) ``name`` on ``remote`` (``wvc push --delete REMOTE NAME``)."""
        from .ops.push import delete_remote_ref

        return delete_remote_ref(self._repository, remote, name)

    def fetch(self, remote: str = "origin", *, progress: Progress = NULL):
        """Download the remote's branches, tags and the objects they need, each verified."""
        from .ops import fetch

        return fetch.fetch(self._repository, remote, progress=progress)

    def pull(self, remote: str = "origin", branch: str | None = None, *, rebase: bool = False, merge: bool = False,
             strategy: str | None = None, progress: Progress = NULL):
        """Fetch, then fast-forward ``branch`` (default HEAD's) and the working tree; ``rebase`` or
        ``merge`` when both sides committed (``strategy`` settles conflicting tensors)."""
        from .ops import pull

        return pull.pull(self._repository, remote, branch, rebase=rebase, merge=merge, strategy=strategy, progress=progress)

    # -- maintenance -----------------------------------------------------------------------
    def gc(self, *, grace_seconds: int = 3600):
        """Remove objects and packs nothing reachable (refs, reflogs) needs, older than the grace period."""
        from .ops import maintenance

        return maintenance.gc(self._repository, grace_seconds=grace_seconds)

    def remote_gc(self, remote: str = "origin", *, dry_run: bool = False, progress: Progress = NULL):
        """Remove from ``remote`` what none of its refs reaches (ops/remote_gc.py)."""
        from .ops import remote_gc

        return remote_gc.remote_gc(self._repository, remote, dry_run=dry_run, progress=progress)

    def prune(self, branch: str | None = None, *, keep, dry_run: bool = False, protect=frozenset(),
              progress: Progress = NULL):
        """Drop the weights of ``branch``'s versions that ``keep`` does not keep (ops/prune.py):
        ``keep`` is a dict (last, every, tagged, best), a string ("last=10,every=100") or a KeepPolicy."""
        from .ops import prune

        return prune.prune(self._repository, branch, keep, dry_run=dry_run, protect=protect, progress=progress)

    def remote_prune(self, remote: str = "origin", branch: str | None = None, *, keep, dry_run: bool = False,
                     protect=frozenset(), progress: Progress = NULL, min_dead_share: float = 0.0):
        """Apply the retention policy ``keep`` to ``branch`` on ``remote`` (ops/prune.py);
        ``protect``: commits kept whatever ``keep`` says; ``min_dead_share``: a pack that keeps
        live chunks is rewritten only once that share of it is dead (a prune every few
        versions: ``integrations.publisher.PERIODIC_DEAD_SHARE``)."""
        from .ops import prune

        return prune.remote_prune(self._repository, remote, branch, keep, dry_run=dry_run, progress=progress,
                                  protect=protect, min_dead_share=min_dead_share)

    def fsck(self):
        """Verify every object, tree and commit (and the base's files); returns what is wrong, if anything."""
        from .ops import maintenance

        return maintenance.fsck(self._repository)

    def stats(self):
        """Counts and sizes: commits, objects by method, logical against stored bytes."""
        from .ops import maintenance

        return maintenance.stats(self._repository)


def clone_with_report(url: str, directory=None, *, branch: str | None = None, lazy: bool = False, base_dir=None,
                      progress: Progress = NULL) -> tuple[Repo, dict]:
    """Clone, returning the new Repo and what the clone did (for ``clone --json``)."""
    from .ops import clone as clone_op

    made, report = clone_op.clone(url, directory, branch=branch, lazy=lazy, base_dir=base_dir, progress=progress)
    made.close()  # opened again: what the clone configured (a lazy clone's supply) is read on open
    return Repo(made.root), report


def clone(url: str, directory=None, *, branch: str | None = None, lazy: bool = False, base_dir=None,
          progress: Progress = NULL) -> Repo:
    """Clone ``url`` (``hf://user/repo`` or a path) into ``directory``; returns the Repo.

    ``lazy``: fetch commits and trees only; chunks are fetched when first needed.
    ``base_dir``: for a remote whose base model is a directory (not a Hub repository), where
    that model is on this machine; a path the remote records is never read."""
    return clone_with_report(url, directory, branch=branch, lazy=lazy, base_dir=base_dir, progress=progress)[0]
