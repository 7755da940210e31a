"""A frozen Dask scheduler found in seconds, not at the stall timeout.

A scheduler process that is stopped (SIGSTOP, a hung VM, a swapped-out node) still accepts TCP
connections -- the kernel queues them -- but never answers, and distributed waits for its
replies without a limit; the job's only guard was the stall timeout (no task finished for
600 s by default), which cannot be short, since a task may legitimately run for minutes.
`SchedulerWatch` tells the two apart: every few seconds it asks the scheduler a question it
answers from memory (its identity, without the worker list), on the client's event loop;
while the scheduler answers, long tasks are only slow.  When it has answered nothing for
``timeout`` s -- and two questions in a row went unanswered, so that an event loop of the
driver's that was itself blocked for a while is not taken for a frozen scheduler -- every
blocking call of the client (`SchedulerWatch.race`) fails with a `ClusterError`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from lshdist.errors import ClusterError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: seconds between two questions (at most; a third of the timeout when that is shorter)
EVERY = 5.0


class SchedulerWatch:
    """Ask the scheduler of ``client`` for its identity every ``every`` s; after ``timeout`` s
    without an answer (two questions unanswered at least), the scheduler is lost: `lost` holds
    the message and `race` fails every blocking call with it.

    Parameters
    ----------
    client : distributed.Client
        A connected, synchronous client (its event loop runs in another thread).
    timeout : float
        Seconds of silence after which the scheduler is declared frozen.
    every : float, optional
        Seconds between questions, and the time a question may take (default `EVERY`, or a
        third of ``timeout`` when shorter).
    """

    def __init__(self, client: Any, timeout: float, every: float | None = None) -> None:
        self.client = client
        self.timeout = float(timeout)
        self.every = float(every) if every is not None else min(EVERY, self.timeout / 3)
        self.lost: str | None = None
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> SchedulerWatch:
        """Start asking (on the client's event loop); returns self."""
        self.client.loop.add_callback(self._start)
        return self

    def stop(self) -> None:
        """Stop asking, and racing: calls wait as they would without the watch (the client's
        ``close`` with a timeout of its own, after a loss)."""
        self._stopped = True
        task = self._task
        if task is not None:
            self.client.loop.add_callback(task.cancel)

    def _start(self) -> None:
        self._event = asyncio.Event()
        if not self._stopped:
            self._task = asyncio.ensure_future(self._beat())

    async def _ask(self) -> bool:
        """One question; True if answered within ``every`` s.  An unanswered question is
        cancelled without waiting for its cancellation (closing a connection to a stopped
        process may itself wait)."""
        question = asyncio.ensure_future(self.client.scheduler.identity(n_workers=0))
        question.add_done_callback(mark_seen)
        try:
            done, _ = await asyncio.wait({question}, timeout=self.every)
        finally:
            question.cancel()  # a no-op once answered
        return bool(done) and not question.cancelled() and question.exception() is None

    async def _beat(self) -> None:
        answered, misses = time.monotonic(), 0
        while not self._stopped:
            started = time.monotonic()
            try:
                ok = await self._ask()
            except asyncio.CancelledError:
                raise
            except Exception:  # a refused or closed connection: unanswered
                ok = False
            if ok:
                answered, misses = time.monotonic(), 0
            else:
                misses += 1
                silent = time.monotonic() - answered
                log.debug("the Dask scheduler did not answer (%.0fs silent)", silent)
                if misses >= 2 and silent >= self.timeout:
                    self._lose(silent)
                    return
            await asyncio.sleep(max(0.0, self.every - (time.monotonic() - started)))

    def _lose(self, silent: float) -> None:
        self.lost = (f"the Dask scheduler at {self.client.scheduler.address} has not answered "
                     f"for {silent:.0f}s (asked every {self.every:g}s): it is frozen or "
                     "unreachable — check the scheduler process, or raise --heartbeat-timeout")
        log.debug("%s", self.lost)
        if self._event is not None:
            self._event.set()

    async def race(self, work: Awaitable[T]) -> T:
        """``await work``, or a `ClusterError` as soon as the scheduler is lost (the work is
        then cancelled).  Runs on the client's event loop.  The work's failure is read even
        when its caller gave up on it (`mark_seen`): a wait abandoned by a stall timeout in the
        same turn of the loop as its futures were cancelled finished with
        ``FuturesCancelledError``, and asyncio logged that with a traceback after the job's
        one-line error (seen in the frozen-scheduler drill)."""
        watching = not (self._stopped or self._event is None)  # (else closing, or not started)
        if watching and self.lost is not None:
            _close(work)
            raise ClusterError(self.lost)
        task = asyncio.ensure_future(outcome(work))
        task.add_done_callback(mark_seen)
        if not watching or self._event is None:
            done: T = unpack(await task)
            return done
        lost = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
                _close(work)  # (cancelled before it started: `outcome` never awaited it)
        if task.done():
            got: T = unpack(task.result())
            return got
        raise ClusterError(self.lost or "the Dask scheduler was lost")


async def outcome(work: Awaitable[T]) -> tuple[bool, Any]:
    """``(True, result)`` or ``(False, exception)`` of ``work``: a task running this never ends
    with an exception of its own.  `mark_seen` reads a failed task's exception in a callback,
    which never runs when the loop stops in the same turn as the task fails — as when a call
    abandoned at the stall timeout (a ``cancel`` of the futures) failed with
    ``ClosedClientError`` as the client closed: asyncio then logged it with a traceback after
    the job's one-line error (the frozen-scheduler drill, rarely).  Cancellation still
    propagates."""
    try:
        return True, await work
    except Exception as exc:
        return False, exc


def _close(work: Awaitable[Any]) -> None:
    """Close ``work`` if it is a coroutine that never started (a task's cancellation reaches
    only a coroutine that runs; one never started is otherwise reported as never awaited)."""
    if inspect.iscoroutine(work) and inspect.getcoroutinestate(work) == inspect.CORO_CREATED:
        work.close()


def unpack(result: tuple[bool, Any]) -> Any:
    """The result `outcome` carried, or its exception raised."""
    ok, value = result
    if ok:
        return value
    raise value


def mark_seen(question: asyncio.Future[Any]) -> None:
    """A question's failure is read (asyncio logs a task's exception that nobody read, with
    its traceback: a question that fails after it was given up, at shutdown)."""
    if not question.cancelled():
        question.exception()
