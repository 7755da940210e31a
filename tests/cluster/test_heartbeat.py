"""The scheduler heartbeat (`lshdist.cluster.heartbeat`): a task that runs longer than the
heartbeat timeout on a scheduler that answers is not a frozen scheduler; a scheduler that stops
answering is (the frozen-process drills are in ``tests/drills/test_stall.py``)."""

from __future__ import annotations

import time

import pytest

from lshdist.cluster.client import dask_client
from lshdist.config import ClusterConfig, from_mapping
from lshdist.errors import ClusterError, InputError


def test_a_long_task_on_a_scheduler_that_answers_runs_on():
    """Progress stalls for 4x the heartbeat timeout; the scheduler answers all along."""
    with dask_client(processes=False, workers=1, heartbeat=0.8) as client:
        t0 = time.monotonic()
        assert client.submit(time.sleep, 3.2, pure=False).result() is None
        assert time.monotonic() - t0 >= 3.2
        assert client.submit(sum, [1, 2], pure=False).result() == 3  # still watched, still fine


async def _never() -> None:
    await _forever()


async def _forever() -> None:
    import asyncio

    await asyncio.Event().wait()


def test_a_scheduler_that_stops_answering_fails_every_waiting_call():
    """The watch's question is made to go unanswered (as a stopped process's would): a call
    already waiting, and every later one, fail with the message within the timeout plus one
    question; the waiting call does not wait for its task (5 s) nor for the stall timeout."""
    with dask_client(processes=False, workers=1, heartbeat=1.5, stall=120) as client:
        assert client.submit(sum, [1, 2], pure=False).result() == 3
        client.scheduler.identity = lambda **kw: _never()  # the scheduler stops answering
        fut = client.submit(time.sleep, 5, pure=False)
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"the Dask scheduler at inproc://\S+ "
                                               r"has not answered for \d+s \(asked every "
                                               r"0\.5s\): it is frozen or unreachable — check "
                                               r"the scheduler process, or raise "
                                               r"--heartbeat-timeout"):
            fut.result()
        assert time.monotonic() - t0 < 1.5 + 2 * 0.5 + 0.5  # not the task's 5 s
        with pytest.raises(ClusterError, match="has not answered"):
            client.scheduler_info()


def test_the_heartbeat_timeout_is_checked():
    with pytest.raises(InputError, match=r"cluster\.heartbeat_timeout: expected a number > 0, "
                                         r"got 0"):
        from_mapping(ClusterConfig, {"heartbeat_timeout": 0}, where="cluster")
    assert ClusterConfig().heartbeat_timeout == 30.0


def _unread_failures(make: object) -> list[str]:
    """Run ``make()`` (a coroutine) as a task to its end on a fresh loop that is then closed
    without another turn (as a client's loop stops at shutdown), drop the task, and return
    what asyncio reported of it: "Task exception was never retrieved" for a task that ended
    with an exception nobody read."""
    import asyncio

    seen: list[str] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(str(ctx.get("message"))))
    task = loop.create_task(make())  # type: ignore[operator]
    while not task.done():
        loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    del task  # (freed at once: no cycle holds a finished task)
    return seen


def test_a_call_that_fails_leaves_no_unread_exception_when_the_loop_stops():
    """A client call's task carries its failure as a value (`outcome`): nothing for asyncio to
    log with a traceback after the job's one-line error when the loop stops before a
    done-callback could read it; `unpack` raises it in the caller."""
    from lshdist.cluster.heartbeat import outcome, unpack

    async def closed() -> None:
        raise RuntimeError("Client is closed")

    assert _unread_failures(closed) == ["Task exception was never retrieved"]  # the control
    assert _unread_failures(lambda: outcome(closed())) == []
    import asyncio

    ok, exc = asyncio.run(outcome(closed()))
    assert not ok and isinstance(exc, RuntimeError)
    with pytest.raises(RuntimeError, match="Client is closed"):
        unpack((ok, exc))
    assert unpack(asyncio.run(outcome(asyncio.sleep(0, result=7)))) == 7
