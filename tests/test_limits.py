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
