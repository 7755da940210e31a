"""`lshdist.limits.one_blas_thread`: one holder sets and restores the limit; others neither
wait nor touch it."""

import threading

from threadpoolctl import threadpool_info, threadpool_limits

from lshdist.limits import one_blas_thread


def _blas_threads() -> int:
    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_nested_and_child_sections_neither_wait_nor_restore_the_limit():
    """A section inside a section (same thread), and one in a thread the holder waits for,
    run at once with BLAS at one thread, and only the outer one restores the limit.  Bug
    caught: a section waiting for the lock its own caller holds (the threaded exact scan inside
    a section deadlocked)."""
    seen: list[int] = []
    done = threading.Event()

    def child() -> None:
        with one_blas_thread():
            seen.append(_blas_threads())

    def outer() -> None:
        with threadpool_limits(2, user_api="blas"):
            with one_blas_thread():
                with one_blas_thread():
                    seen.append(_blas_threads())
                seen.append(_blas_threads())  # the inner one restored nothing
                t = threading.Thread(target=child)
                t.start()
                t.join()
            seen.append(_blas_threads())  # the holder restored the limit
        done.set()

    worker = threading.Thread(target=outer, daemon=True)
    worker.start()
    assert done.wait(60), "a section waited for one its caller holds"
    assert seen == [1, 1, 1, 2]


def test_driver_malloc_applied_unless_the_user_set_it(monkeypatch):
    """`keep_freed_memory` applies `DRIVER_MALLOC` through glibc's mallopt (every call
    accepted) and changes nothing where the user set any MALLOC_* variable of `MALLOC_ENV`;
    the command line calls it before any job."""
    import ctypes
    import platform

    from lshdist import cli, limits

    for k in limits.MALLOC_ENV:
        monkeypatch.delenv(k, raising=False)
    glibc = platform.libc_ver()[0] == "glibc"
    assert limits.keep_freed_memory() is glibc
    seen: list[tuple[int, int]] = []

    class FakeLibc:
        def __init__(self, *_):
            self.mallopt = self

        def __call__(self, param, value):
            seen.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", FakeLibc)
    assert limits.keep_freed_memory() is True
    assert seen == [(limits._MALLOPT[k], v) for k, v in limits.DRIVER_MALLOC.items()]
    assert dict(seen)[-3] >= 63 * 2**20  # a 20,000 x 784 float32 shard stays on the heap
    seen.clear()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limits.keep_freed_memory() is False and seen == []
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    called: list[int] = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: called.append(1) or True)
    assert cli.main(["info", "/nonexistent-lshdist-index"]) == 2
    assert called == [1]
