"""One sync at a time, off the trainer's thread, the newest waiting: what lets ``send_weights``
return once it holds a snapshot (integrations/trl.py).

A trainer produces versions faster than a slow link or a busy server can take them. Queueing
every one would grow memory (a snapshot each) and lag without bound, and the servers want the
newest anyway; so one job runs and one waits, and a job submitted while one waits takes its
place (the older is dropped: ``superseded`` counts them). A job's failure is kept and raised
by the next ``raise_failure()`` or ``wait()``: the trainer hears it at its next call, as it
would have from a blocking sync, one step later.

The worker thread is not a daemon: a process that ends while a sync runs finishes it (an
interpreter exit joins it), so the last version a trainer sent is published.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

from ..codec.pool import work_in_background


class SyncQueue:
    def __init__(self, name: str = "wvc-sync"):
        self.name = name
        self.superseded = 0  # jobs dropped for a newer one before they started
        self._cond = threading.Condition()
        self._waiting: Callable[[], None] | None = None
        self._running = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._foreground = False  # while the caller's thread wants the CPUs (foreground())

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` after the one running (if any), in place of any job still waiting."""
        with self._cond:
            if self._waiting is not None:
                self.superseded += 1
            self._waiting = job
            if not self._running:
                self._running = True
                self._thread = threading.Thread(target=self._work, name=self.name)
                self._thread.start()

    @contextmanager
    def foreground(self):
        """While held, the running job pauses at its next ``yield_to_foreground()``: the
        caller's work (the trainer's snapshot) has the CPUs, the job's in-flight pieces aside."""
        with self._cond:
            self._foreground = True
        try:
            yield
        finally:
            with self._cond:
                self._foreground = False
                self._cond.notify_all()

    def yield_to_foreground(self) -> None:
        """For a job, between its pieces: wait while the caller holds ``foreground()``."""
        with self._cond:
            self._cond.wait_for(lambda: not self._foreground)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._running

    def raise_failure(self) -> None:
        """Raise the failure of a job that ended since the last call (once), if one failed."""
        with self._cond:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def wait(self, timeout: float | None = None) -> bool:
        """Until no job runs or waits (False if ``timeout`` seconds passed first); then
        ``raise_failure()``."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self._running, timeout):
                return False
        self.raise_failure()
        return True

    def _work(self) -> None:
        work_in_background()  # the trainer's own steps come first where they share cores
        while True:
            with self._cond:
                job, self._waiting = self._waiting, None
                if job is None:
                    self._running = False
                    self._cond.notify_all()
                    return
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - kept for the trainer's next call
                with self._cond:
                    self._failure = exc
