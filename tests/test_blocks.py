"""The row-range helpers of lshdist.blocks: how a process's work is shared among threads."""

import threading
from contextlib import contextmanager

from lshdist.blocks import on_row_ranges, row_ranges


def test_row_ranges_cover_the_rows_once_in_order():
    assert row_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert row_ranges(2, 5) == [(0, 1), (1, 2)]  # no empty range
    assert row_ranges(0, 4) == [] and row_ranges(7, 0) == [(0, 7)]


def test_on_row_ranges_runs_each_range_once_in_order_on_threads_only_when_several():
    """Planted bugs it catches: results in completion order instead of range order, a lost
    last range, the thread context entered (or a thread started) for a single range, and no
    call at all for zero rows (callers rely on one result)."""
    entered: list[int] = []

    @contextmanager
    def ctx():
        entered.append(1)
        yield

    main = threading.get_ident()
    seen: list[tuple[int, int, bool]] = []

    def fn(a: int, b: int) -> list[int]:
        seen.append((a, b, threading.get_ident() == main))
        return list(range(a, b))

    out = on_row_ranges(fn, 1001, 4, threaded=ctx)
    assert [x for part in out for x in part] == list(range(1001)) and len(out) == 4
    assert entered == [1] and not any(on_main for *_, on_main in seen)
    seen.clear()
    assert on_row_ranges(fn, 50, 1, threaded=ctx) == [list(range(50))]
    assert entered == [1] and seen == [(0, 50, True)]
    assert on_row_ranges(fn, 0, 3) == [[]]
