"""What each database row carries for the exact re-rank, and the query-side counterpart.

Explicit metrics (and plain L2) re-rank on ``z = G x`` (`DensePayload`); implicit metrics on the
sparse (or dense) rows plus their kernel values against the basis (`KernelPayload`).
Payloads are plain arrays so that a segment stores them in Zarr and kernels read them directly.
Nothing here knows the metric objects (the metric learners' exact neighbours use these payloads
through `lshdist.index.scan`); the payload of rows under a metric is made by
`lshdist.index.metric_payload.make_payload`.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from lshdist._kernels.search import (
    byte_grid_fill,
    byte_grid_unit,
    centred_sq_norms,
    column_bounds,
    grid_fill_block,
    grid_floor,
    grid_norms,
    grid_rows,
    grid_scale,
    grid_steps,
    grid_table_exact,
    grid_unit,
    grid_unit_block,
    quantize_block,
    rerank_dense,
    rerank_dense_quantized,
    rerank_sparse,
)
from lshdist.blocks import SparseBlock, on_row_ranges
from lshdist.errors import InputError

#: rows of at least this many columns are re-ranked with a first pass on a uint8 copy
#: (`rerank_dense_quantized`: the same answer, a quarter of the bytes for most candidates);
#: narrower rows fit a cache line or two either way
QUANTIZED_MIN_COLUMNS = 32


def column_bounds_parallel(Z: np.ndarray, n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """`lshdist._kernels.search.column_bounds` of all rows of ``Z``, in row ranges on
    ``n_threads`` threads (min / max of the parts': the same arrays)."""
    bounds = on_row_ranges(lambda a, b: column_bounds(Z, a, b), len(Z),
                           min(int(n_threads), len(Z) // 4096))
    lo = np.min([b[0] for b in bounds], axis=0).astype(np.float32)
    hi = np.max([b[1] for b in bounds], axis=0).astype(np.float32)
    return lo, hi


def quantize_parallel(Z: np.ndarray, n_threads: int = 1,
                      bounds: tuple[np.ndarray, np.ndarray] | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """`lshdist._kernels.search.quantize_rows` of ``Z`` float32 (N, d), its row ranges on
    ``n_threads`` threads (each kernel is nogil): the same ``lo``, ``step``, ``U`` and ``err``
    (tested), ``scale`` within an ulp.  ``bounds``: `column_bounds_parallel` of ``Z`` when
    the caller has them.  The copy is made once per payload; on Fashion-MNIST's
    60,000 rows it took 0.10 s on one thread."""
    N, d = Z.shape
    lo, hi = bounds if bounds is not None else column_bounds_parallel(Z, n_threads)
    U = np.zeros((N, d), dtype=np.uint8)
    err = np.zeros(N)
    step, inv = grid_steps(lo, hi, N)
    maxima = on_row_ranges(lambda a, b: quantize_block(Z, lo, step, inv, U, err, a, b), N,
                           min(int(n_threads), N // 4096))
    z_max = max(float(m[0]) for m in maxima)
    g_max = max(float(m[1]) for m in maxima)
    return lo, step, U, err, float(grid_scale(lo, z_max, g_max))


def exact_grid_parallel(Z: np.ndarray, bounds: tuple[np.ndarray, np.ndarray],
                        n_threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`lshdist._kernels.search.exact_grid` of ``Z`` (column bounds ``bounds``) in row ranges
    on ``n_threads`` threads: ``(lo, step, U)`` or None, the same result (the unit is the
    smallest of the parts', then each part is checked and filled against it; tested).  On
    Fashion-MNIST's 60,000 rows: 0.25 s in one piece before this (a division per entry and
    an exit inside the inner loop), ~0.05 s on 2 threads now."""
    lo, hi = bounds
    N, d = Z.shape
    parts = min(int(n_threads), N // 4096)
    floor = grid_floor(lo, hi)
    units = on_row_ranges(lambda a, b: grid_unit_block(Z, lo, floor, a, b), N, parts)
    if min(units) < 0.0:
        return None
    g = float(grid_unit(min(units)))
    if g < 0.0:
        return None
    U = np.empty((N, d), dtype=np.uint8)

    def fill(a: int, b: int) -> tuple[bool, np.ndarray]:
        umax = np.zeros(d, dtype=np.uint8)  # the largest unit count of each column
        return bool(grid_fill_block(Z, lo, g, a, b, U, umax)), umax

    filled = on_row_ranges(fill, N, parts)
    oks = [ok for ok, _ in filled]
    umaxes = [umax for _, umax in filled]
    step = np.full(d, g, dtype=np.float32)
    if not all(oks) or not grid_table_exact(lo, step, np.max(umaxes, axis=0)):
        return None
    return lo, step, U


def grid_quantized(lo: np.ndarray, step: np.ndarray, U: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """`quantize_parallel`'s tuple for rows exactly on the grid ``lo + step U``: the grid
    itself, no error; `InputError` if ``lo + step u`` is not a float32 number throughout."""
    ok, z_max, g_max = grid_norms(U, lo, step)
    if not ok:
        raise InputError("a grid payload's entries lo + step u are not all float32 "
                         "numbers: it was not stored from an exact grid")
    return lo, step, U, np.zeros(len(U)), float(grid_scale(lo, z_max, g_max))


#: the rows argument of `rerank_dense_quantized` for a payload read on its exact grid
_NO_ROWS = np.empty((0, 0), dtype=np.float32)

#: unit roundoff of float32 and float64
U32, U64 = 2.0 ** -24, 2.0 ** -53
#: the relative bound the exact scan allows the re-rank of payloads computed in float64 (their
#: distances are rounded to float32 when reported): far above their float64 rounding
REL_F64_PAYLOAD = 2.0 ** -22


#: rows whose centre is farther than this many times their largest distance from it from the
#: origin are multiplied centred by the scan (a float32 copy: twice the payload's memory, for
#: such rows only)
FAR_FROM_ORIGIN = 4.0
#: the smallest float32 subnormal: a float32 operation's result underflowing is off by at most
#: this much in absolute terms, which no relative bound covers
TINY32 = 2.0 ** -149


def refuse_overflow(dist: np.ndarray, top: np.ndarray, what: str = "squared distance"
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(dist, top)`` of a re-rank, unless a returned neighbour's distance overflowed float32
    (inf where a row was found): such neighbours would be ranked by id, not distance, so the
    whole call is refused (`InputError`) rather than answered silently wrong.  Rows padded
    for lack of candidates (id -1) are inf by design and pass."""
    bad = np.isinf(dist) & (top >= 0)
    if bad.any():
        q, j = (int(v) for v in np.argwhere(bad)[0])
        raise InputError(f"a query's {what} to database row {int(top[q, j])} exceeds float32's "
                         "range (3.4e38): its neighbours cannot be ranked; scale the data (or "
                         "its metric) down, or check the queries for a unit or encoding error")
    return dist, top


def gamma(n: int, u: float) -> float:
    """``gamma_n = n u / (1 - n u)``: a bound on the relative rounding of n floating-point
    operations in a product or sum, in any order (Higham, Accuracy and Stability of Numerical
    Algorithms, 3.1); infinite (no bound: the scan then re-ranks every row) for n u >= 1/2."""
    return n * u / (1.0 - n * u) if n * u < 0.5 else float("inf")


def f64_slack(scale: np.ndarray) -> np.ndarray:
    """The scan's slack for payloads whose scores and re-rank are both float64 sums of exact
    products: far above ``gamma_n`` (u = 2^-53) for any n below 10^6 terms, times the
    magnitude ``scale`` (Q,) of what is summed."""
    out: np.ndarray = 1e-9 * np.asarray(scale, np.float64)
    return out


def scan_centre(Z: np.ndarray) -> np.ndarray:
    """The centre c of the scan's scores (`DensePayload.distances`): the mean of about 1,024
    evenly spaced rows, each entry rounded to a multiple of the power of two at or below the
    rows' spread.  Any point among the rows serves; the rounding keeps the differences
    ``z - c`` exact wherever the rows' own values are multiples of that power (small integers:
    pixels, counts), so rows at exactly equal distances still score exactly equal, and ties
    go by id (`tests/index/test_ties.py`)."""
    if len(Z) == 0:
        return np.zeros(Z.shape[1], np.float32)
    return centre_of_sample(Z[centre_sample(len(Z))])


def centre_sample(n: int) -> slice:
    """The rows `scan_centre` averages: about 1,024 evenly spaced of ``n``."""
    return slice(None, None, max(1, n // 1024))


def centre_of_sample(S: np.ndarray) -> np.ndarray:
    """`scan_centre` of the rows `centre_sample` picked (float32 (m, d), m >= 1)."""
    S = S.astype(np.float64)
    mu = S.mean(axis=0)
    spread = float(np.sqrt(S.var(axis=0).mean()))
    unit = 2.0 ** np.floor(np.log2(spread)) if spread > 0 else 1.0
    out: np.ndarray = (np.round(mu / unit) * unit).astype(np.float32)
    return out


def checked_centred_norms(Z: np.ndarray, ids: np.ndarray | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """``(c, ||z - c||^2)``: the scan's centre of float32 rows ``Z`` (`scan_centre`) and their
    float32 squared norms about it; `InputError` if one overflows float32 (the re-rank would
    rank infinities).  ``ids`` name the rows in the message (default: their positions)."""
    c = scan_centre(Z)
    norms = centred_sq_norms(Z, c)
    check_norms(norms, ids)
    return c, norms


def check_norms(norms: np.ndarray, ids: np.ndarray | None = None) -> None:
    """`checked_centred_norms`' refusal of a row whose squared norm overflowed float32."""
    if len(norms) and not np.isfinite(norms.max()):
        row = int(np.flatnonzero(~np.isfinite(norms))[0])
        name = row if ids is None else int(ids[row])
        raise InputError(f"row {name}'s squared distance from the rows' centre exceeds "
                         "float32's range (3.4e38): distances among these rows cannot "
                         "be ranked in float32; scale the data down (or its metric)")


@dataclass(frozen=True)
class Projection:
    """A dense payload's rows in an orthonormal basis of ``r`` directions (`DensePayload.
    projection`): centre ``c`` (d,), basis ``P`` float32 (r, d), ``s2`` >= its largest
    squared singular value, ``Zp`` float32 (N, r) the projected rows ``P (z - c)``, ``zn``
    their squared norms, ``r_max`` >= the rows' largest distance from ``c``."""

    c: np.ndarray
    P: np.ndarray
    s2: float
    Zp: np.ndarray
    zn: np.ndarray
    r_max: float


#: float32 bytes of the rows a scan makes at a time from a payload held on its grid alone
#: (`DensePayload.block_rows`: 668 rows at d = 784), instead of making and keeping all of
#: them.  Small: a block is multiplied while it is still in the core's cache, and it is below
#: numpy's 4 MiB huge-page threshold, so a fresh process faults in no huge page for it
#: (30,000 x 784 pixels, 200 queries: a fresh worker's first calibration scan 0.16 s against
#: 0.34-0.38 s with blocks of 32 MiB; a 100,000-row segment's pruned calibration, 1,000
#: queries, 1.07x faster).  The cost: a warm process's scan of 1,024 queries or more (a bulk
#: ``--mode scan``) makes more, smaller products, 3-7 % slower than with 32 MiB blocks (the
#: calibration times the scan with these blocks, so `auto` weighs what it will run)
GRID_BLOCK_BYTES = 2 << 20


class DensePayload:
    """``Z`` float32 (N, d): transformed rows; the learned distance is L2 between them.

    Rows that are exactly ``lo + g u`` for one unit ``g`` and uint8 ``u`` (`exact_grid`:
    pixels, counts) are stored on that grid (`arrays`: ``U`` uint8, ``lo``, ``step``; a
    quarter of the bytes) and, read back (`from_grid`), held on it alone: the re-rank rebuilds
    the float32 rows it reads exactly (`rerank_dense_quantized`), the scan's product and the
    truth's projection make `GRID_BLOCK_BYTES` of them at a time, and ``Z`` is made whole (and
    kept) only where a path asks for it."""

    kind = "dense"

    def __init__(self, Z: np.ndarray):
        self._Z: np.ndarray | None = np.ascontiguousarray(Z, dtype=np.float32)
        if self._Z.ndim != 2:
            raise InputError(f"a dense payload's rows must be 2-d, got {self._Z.ndim}-d")
        self.shape: tuple[int, int] = (int(self._Z.shape[0]), int(self._Z.shape[1]))
        self._grid: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._grid_checked = False
        self._quantized: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float] | None = None
        self._lock = threading.RLock()
        #: (held on its grid) the float32 rows of the payload it was compacted from, while
        #: that one lives (`compact`)
        self._lent: weakref.ref[np.ndarray] | None = None

    @classmethod
    def from_grid(cls, lo: np.ndarray, step: np.ndarray, U: np.ndarray) -> DensePayload:
        """A payload held on its exact grid: row i is ``lo + step * U[i]`` in float32.

        Raises
        ------
        InputError
            If the shapes disagree, or an entry ``lo + step u`` is not exactly a float32
            number (such rows were not stored from an exact grid)."""
        lo = np.ascontiguousarray(lo, dtype=np.float32)
        step = np.ascontiguousarray(step, dtype=np.float32)
        U = np.ascontiguousarray(U, dtype=np.uint8)
        if U.ndim != 2 or lo.shape != (U.shape[1],) or step.shape != lo.shape:
            raise InputError(f"a grid payload has U (N, d), lo (d,) and step (d,); got U "
                             f"{U.shape}, lo {lo.shape}, step {step.shape}")
        return cls._on_grid((lo, step, U), grid_quantized(lo, step, U))

    @classmethod
    def from_bytes(cls, B: np.ndarray) -> DensePayload:
        """Rows of uint8 values (a dataset stored as bytes, under the identity metric) without
        their float32 copy: held on the exact grid that `compact` finds for the same rows in
        float32 -- ``lo`` the column minima, one unit ``g`` (the smallest positive step above
        a column's minimum; 1 when every column is constant) and ``u = (x - lo) / g``, the
        same arrays (tested) --, or, when some step is not a multiple of ``g``, as those
        float32 rows (as `compact` keeps them)."""
        if B.dtype != np.uint8 or B.ndim != 2:
            raise InputError(f"byte rows are uint8 (n, d), got {B.dtype} {B.shape}")
        if len(B) == 0:
            return cls(B)
        B = np.ascontiguousarray(B)
        lo = B.min(axis=0)
        g = int(byte_grid_unit(B, lo)) or 1
        if g == 1:
            U = B - lo if lo.any() else B  # (no wrap: every entry is at least its minimum)
        else:
            U = np.empty_like(B)
            if not byte_grid_fill(B, lo, g, U):
                return cls(B)
        return cls.from_grid(lo.astype(np.float32), np.full(B.shape[1], g, np.float32), U)

    @classmethod
    def _on_grid(cls, grid: tuple[np.ndarray, np.ndarray, np.ndarray],
                 quantized: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]
                 ) -> DensePayload:
        """A payload held on ``grid`` alone, its checked `grid_quantized` tuple given."""
        p = cls.__new__(cls)
        p._Z = None
        p.shape = (int(grid[2].shape[0]), int(grid[2].shape[1]))
        p._grid, p._grid_checked, p._quantized = grid, True, quantized
        p._lent = None
        p._lock = threading.RLock()
        return p

    @property
    def Z(self) -> np.ndarray:
        """The rows, float32 (N, d); for a payload held on its grid, those of the payload it
        was compacted from while that one lives (the same numbers), else made at the first use
        (and kept)."""
        if self._Z is None:
            lent = None if self._lent is None else self._lent()
            if lent is not None:
                return lent
            with self._lock:
                if self._Z is None:
                    assert self._grid is not None
                    lo, step, U = self._grid
                    Z = np.empty(U.shape, dtype=np.float32)
                    grid_rows(U, lo, step, Z)
                    self._Z = Z
        return self._Z

    @property
    def held_on_grid(self) -> bool:
        """Whether the rows are held only on their exact grid (no float32 copy made yet)."""
        return self._Z is None

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict[str, np.ndarray]:
        # sent to a worker without its lock and uint8 copy (remade there), or as its grid
        if self._Z is None:
            assert self._grid is not None
            return dict(zip(("lo", "step", "U"), self._grid, strict=True))
        return {"Z": self._Z}

    def __setstate__(self, state: dict[str, np.ndarray]) -> None:
        if "Z" in state:
            self.__init__(state["Z"])  # type: ignore[misc]
        else:
            self.__dict__.update(DensePayload.from_grid(**state).__dict__)

    def exact_grid(self, n_threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(lo, step, U)`` when every row is exactly ``lo + step u`` for uint8 ``u`` and
        one unit (`lshdist._kernels.search.exact_grid`), else None; found once on
        ``n_threads`` (the column bounds, then two passes over the rows: 0.09 s at 60,000 x
        784 on one thread; real-valued rows fail within their first 64 rows)."""
        with self._lock:
            if not self._grid_checked:
                self._find_grid(column_bounds_parallel(self.Z, n_threads), n_threads)
            return self._grid

    def _find_grid(self, bounds: tuple[np.ndarray, np.ndarray], n_threads: int = 1) -> None:
        """`exact_grid` given the rows' column bounds, on ``n_threads`` (held lock)."""
        if len(self.Z):
            self._grid = exact_grid_parallel(self.Z, bounds, n_threads)
        self._grid_checked = True

    def compact(self) -> DensePayload:
        """The same rows held on their exact grid alone (no float32 copy: a quarter of the
        memory, and the re-rank reads only uint8 rows) when they lie on one; else ``self``."""
        grid = self.exact_grid()
        if grid is None or self._Z is None:
            return self
        # the grid's float32 test and norms, made once (`quantized` of rows on their grid)
        out = DensePayload._on_grid(grid, self.quantized())
        # while this payload lives (a fitted segment whose writes still run, its query
        # already scanning the compact one), its float32 rows serve: not made a second time
        out._lent = weakref.ref(self._Z)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """What a segment stores: the exact grid's ``U``, ``lo``, ``step`` when the rows lie
        on one (`exact_grid`), else ``Z``."""
        grid = self.exact_grid()
        if grid is not None:
            return dict(zip(("lo", "step", "U"), grid, strict=True))
        return {"Z": self.Z}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> DensePayload:
        """From stored arrays (`arrays`): ``Z`` float32 (N, d), or its exact grid ``U`` uint8
        (N, d), ``lo`` and ``step`` float32 (d,).

        Raises
        ------
        InputError
            If an array is missing, extra, or of the wrong dtype or shape, or the grid does not
            rebuild float32 rows exactly.
        """
        if set(a) == {"U", "lo", "step"}:
            return cls.from_grid(_check_array(a["lo"], "lo", np.float32, 1),
                                 _check_array(a["step"], "step", np.float32, 1),
                                 _check_array(a["U"], "U", np.uint8, 2))
        if set(a) != {"Z"}:
            raise InputError(f"a dense payload has arrays ['Z'] or ['U', 'lo', 'step'], got "
                             f"{sorted(a)}")
        Z = _check_array(a["Z"], "Z", np.float32, 2)
        return cls(Z)

    @property
    def width(self) -> float:
        """Numbers per row an exact distance reads (for the calibration's cost model)."""
        return float(self.shape[1])

    def take(self, rows: slice | np.ndarray) -> DensePayload:
        """Rows ``rows``: a slice, or an integer array (any order)."""
        if self._Z is None:  # held on its grid: so is the part
            assert self._grid is not None
            lo, step, U = self._grid
            return DensePayload.from_grid(lo, step, U[rows])
        return DensePayload(self._Z[rows])

    def rerank(self, offsets: np.ndarray, rows: np.ndarray, query: DensePayload, k: int,
               tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of each query's candidates (CSR ``offsets``/``rows``), ties by
        ``tiebreak[row]``: ``(float32 (Q, k), int64 rows (Q, k))``."""
        if query.Z.shape[1] != self.shape[1]:  # the kernel reads d entries of each query
            raise InputError(f"queries have {query.Z.shape[1]} payload columns, the index "
                             f"{self.shape[1]}: were they encoded with the index's model?")
        if self._Z is not None and (
                self.shape[1] < QUANTIZED_MIN_COLUMNS or len(offsets) < 2
                or int(np.max(np.diff(offsets))) <= 4 * k):  # the scan's few rows per query
            return refuse_overflow(*rerank_dense(offsets, rows, self._Z, query.Z, k, tiebreak))
        q = self.quantized()
        # rows on an exact grid: the exact pass rebuilds them from the uint8 rows the first
        # pass has just read (in cache) rather than gathering their float32 copies
        Z = self._Z if self._grid is None else _NO_ROWS  # (then q is the grid itself)
        dist, top, _ = rerank_dense_quantized(offsets, rows, Z, query.Z, k, tiebreak, *q)
        return refuse_overflow(dist, top)

    def quantized(self, n_threads: int = 1
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """The rows on a per-column uint8 grid (`quantize_rows`), made at the first re-rank
        (or by `prepare`) and kept in memory (d bytes + 8 per row) — or, for rows on an exact
        grid (`exact_grid`), that grid with no error, which is what a segment stores.
        ``n_threads`` > 1: made in that many row ranges on threads (the same arrays: bounds
        are min / max of the parts', each row is quantized on its own)."""
        with self._lock:  # the search's threads share one payload
            if self._quantized is None:
                bounds = None
                if not self._grid_checked:  # the bounds serve the grid test and the copy
                    bounds = column_bounds_parallel(self.Z, n_threads)
                    self._find_grid(bounds, n_threads)
                if self._grid is not None:  # exact: the same first pass with no error, no copy
                    self._quantized = grid_quantized(*self._grid)
                else:
                    self._quantized = quantize_parallel(self.Z, n_threads, bounds)
            return self._quantized

    def prepare(self, n_threads: int = 1) -> None:
        """Make the uint8 copy of the re-rank's first pass now, on ``n_threads`` threads
        (a search about to re-rank many candidates per query calls this before its threads
        start: made inside the first re-rank, the other threads would wait for one), and the
        scan's centred norms (`distances`)."""
        if self.shape[1] >= QUANTIZED_MIN_COLUMNS or self._Z is None:
            self.quantized(n_threads)
        if self._Z is not None:  # the scan's centring, before anything is timed (a payload
            self._centred()      # held on its grid makes it at its first scan, a block of
            #                      rows at a time)

    def distances(self, query: DensePayload) -> np.ndarray:
        """Scores that order each query's rows as their squared distances do, by float32 BLAS:
        ``||z - c||^2 - 2 (q - c)^T z`` about a centre ``c`` of the rows (`scan_centre`; with
        ``z - c`` in the product for rows far from the origin, see `_centred`) —
        ``||q - z||^2`` less terms that are the same along a query's row (the scan keeps the
        best rows by these and re-checks them exactly).  Centred, the product's rounding is
        ``~u |q - c| |z|``, not ``~u |q| |z|``: rows far from the origin against their spread
        (20-d N(0, 1) + 1,000) kept their order, where ``||z||^2 - 2 q^T z`` gave 284 of 300
        queries other neighbours.  One pass over the (Q, N) result after the product, not three: at
        200 x 60,000 each pass costs about a tenth of the product."""
        c, norms, Zc, far = self._centred()
        qm = (query.Z - c) * np.float32(-2.0)
        # rows far from their centre's distance to the origin are multiplied as z - c, never
        # as z (`scan_slack`'s bound assumes it), even when float rows appeared after the
        # centring (lent, or made by another path) and no centred copy was kept
        Y = Zc if Zc is not None else (None if far else self._rows_held())
        if Y is not None:
            # rows far from the origin against their spread are multiplied centred (a copy,
            # made for them only): the product's rounding is then ~u |q - c| |z - c|
            D: np.ndarray = qm @ Y.T
        else:  # held on its grid alone: the rows made a block at a time, not kept (made
            #    whole and kept, a query's recall check held 4x the grid's bytes per segment)
            D = np.empty((len(qm), self.shape[0]), np.float32)
            step = self.block_rows()
            for a in range(0, self.shape[0], step):
                B = self._row_block(slice(a, a + step))
                if far:
                    B = B - c  # (not in place: a block of rows held is a view of them)
                D[:, a:a + len(B)] = qm @ B.T
        D += norms[None, :]
        return D

    def scan_slack(self, query: DensePayload) -> tuple[np.ndarray, np.ndarray, float]:
        """The rounding bound of `distances` (see `RerankPayload.scan_slack`).

        Scores are ``fl(-2 fl(q - c) . y) + n_z`` with ``n_z`` the float32 centred norm and
        ``y`` the rows multiplied — ``z``, or ``z - c`` for rows far from the origin
        (`_centred`) — so ``|score - s| <= gamma_(d+8) (2 |q - c| max|y| + max n_z)`` for the
        exact ``s = ||z - c||^2 - 2 (q - c).y`` (d products summed in any order, the centring,
        the norm and the final sum; max|z| <= sqrt(max n_z) + |c|); the offset is
        ``|q - c|^2 + 2 (q - c).c`` for ``y = z`` and ``|q - c|^2`` for ``y = z - c``, so that
        ``s + offset = ||q - z||^2``; the re-rank's float32 difference form is within
        ``gamma_(d+2)`` (relative) of it; and ``(4d + 16) 2^-149`` covers results that
        underflow."""
        c, norms, _, far = self._centred()
        d = self.shape[1]
        g = gamma(d + 8, U32)
        n2 = (float(norms.max()) if len(norms) else 0.0) * (1.0 + g)
        c64 = c.astype(np.float64)
        qc = query.Z.astype(np.float64) - c64
        q_norm = np.sqrt(np.einsum("ij,ij->i", qc, qc))
        # the rows multiplied: z (max |z| <= max |z - c| + |c|), or z - c rounded to float32
        # (its rounding, u |z - c|, is within gamma_(d+8)'s spare terms)
        z_max = np.sqrt(n2) * (1.0 + g) + (float(np.sqrt(c64 @ c64)) if not far else 0.0)
        # underflow (rows or differences within ~1e-19 of 0) is absolute, for the score's d
        # products and norm terms and for the re-rank's d squares
        slack = g * (2.0 * q_norm * z_max + n2) + (4 * d + 16) * TINY32
        offset = q_norm ** 2 + (2.0 * (qc @ c64) if not far else 0.0)
        return offset, slack, gamma(d + 2, U32)

    def projection(self, rank: int) -> Projection:
        """The rows in the top ``rank`` principal directions of about 1,024 evenly spaced rows,
        about the scan's centre (`Projection`, for `lower_bounds`); made per call, not kept."""
        c, norms, _, _ = self._centred()
        N, d = self.shape
        sample = self._row_block(slice(None, None, max(1, N // 1024))).astype(np.float64) - c
        r = min(rank, d, len(sample))
        if d <= len(sample):  # the d x d Gram's eigenvectors: half an SVD's time at 1,024 x 784
            _, V = np.linalg.eigh(sample.T @ sample)
            basis = V[:, ::-1][:, :r].T
        else:
            basis = np.linalg.svd(sample, full_matrices=False)[2][:r]
        P = np.ascontiguousarray(basis, dtype=np.float32)
        # the basis in float32 is orthonormal only to rounding: ||P v|| <= s ||v|| for s its
        # largest singular value (float64, ~1e-15 relative; a margin above it)
        s2 = float(np.linalg.norm(P.astype(np.float64), 2)) ** 2 * (1.0 + 1e-9)
        Zp = np.empty((N, len(P)), dtype=np.float32)
        step = self.block_rows()
        for a in range(0, N, step):  # y = z - c rounded, then the product (`lower_bounds`)
            Zp[a: a + step] = (self._row_block(slice(a, a + step)) - c) @ P.T
        zn = np.einsum("ij,ij->i", Zp, Zp)
        r_max = float(np.sqrt(float(norms.max()) * (1.0 + gamma(d + 2, U32)))) if N else 0.0
        return Projection(c, P, s2, Zp, zn, r_max)

    def lower_bounds(self, query: DensePayload, proj: Projection, out: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Scores of every row for every query that bound the squared distance from below:
        ``(S float32 (Q, N), offset (Q,), slack (Q,), rel)`` with, for every row z,
        ``S + offset - slack <= s^2 ||q - z||^2`` (``s^2`` = `Projection.s2`), and ``rel``
        the re-rank's relative rounding (as `scan_slack`'s).  ``out``: float32 of at least
        (Q, N), C-ordered, to hold S (a buffer reused by the caller: on a VM that faults new
        memory in at ~2 s a GiB, a fresh 100 MB block per call cost more than the product).

        ``S + offset`` is ``||P(q - c) - P(z - c)||^2`` in float32 (the rows' part of the
        product form, as `distances`); exactly, ``||P (q - z)||^2 <= s^2 ||q - z||^2``.  The
        slack bounds the rounding: each projected entry is within ``gamma_(d+1) s |y|`` of
        its exact value (``y = z - c`` rounded, the d products), so with
        ``T = s (|q - c| + max |z - c|)`` the squared norm of the difference is within
        ``(2 sqrt(r) g + r g^2) T^2`` (g = ``gamma_(d+1)``), and its product form over r
        terms within ``2 gamma_(r+3) (1 + sqrt(r) g)^2 T^2``; the slack is twice their sum,
        plus ``(4 d + 4 r + 16) 2^-149`` for underflow (the products', and the re-rank's d
        squares whose distance the caller compares the bound with)."""
        Qp = (query.Z - proj.c) @ proj.P.T
        Q, N = len(Qp), len(proj.Zp)
        S: np.ndarray = np.empty((Q, N), np.float32) if out is None else out[:Q, :N]
        np.matmul(Qp * np.float32(-2.0), proj.Zp.T, out=S)
        S += proj.zn[None, :]
        r, d = proj.P.shape
        q64 = query.Z.astype(np.float64) - proj.c.astype(np.float64)
        q_norm = np.sqrt(np.einsum("ij,ij->i", q64, q64))
        T2 = proj.s2 * (q_norm + proj.r_max) ** 2
        g = gamma(d + 1, U32)
        rt = float(np.sqrt(r))
        slack = 2.0 * ((2.0 * rt * g + r * g * g) + 2.0 * gamma(r + 3, U32) * (1.0 + rt * g) ** 2
                       ) * T2 + (4 * d + 4 * r + 16) * TINY32
        qp64 = Qp.astype(np.float64)
        return S, np.einsum("ij,ij->i", qp64, qp64), slack, gamma(d + 2, U32)

    def _centred(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, bool]:
        """``(c, ||z - c||^2, Z - c or None, far)``: a centre of the rows, their squared norms
        about it (float32) and whether the rows' centre lies more than `FAR_FROM_ORIGIN` times
        their largest distance from it away from the origin (``far``), and then the rows
        centred (float32; the scan's product then rounds ~u |q - c| |z - c|, not
        ~u |q - c| |z|, so its rounding bound keeps few candidates: at 10^6 from the origin,
        unit spread, every row was re-ranked without it) -- for rows held on their grid alone,
        None: `distances` centres each block it makes.  Made once (by `prepare`, or the first
        scan; racing threads compute the same values): 0.018 s at 60,000 x 784, where the
        plain norms took 0.013 s.  Held on the grid alone, the same numbers, from the rows
        made a block at a time (`centred_sq_norms` sums each row on its own)."""
        got = getattr(self, "_centred_norms", None)
        if got is None:
            # (`checked_centred_norms` a block of rows at a time: views of rows held, rows
            # made from the grid otherwise)
            N, step = self.shape[0], self.block_rows()
            c = (centre_of_sample(self._row_block(centre_sample(N))) if N
                 else np.zeros(self.shape[1], np.float32))
            norms = np.concatenate([np.empty(0, np.float32), *(
                centred_sq_norms(self._row_block(slice(a, a + step)), c)
                for a in range(0, N, step))])
            check_norms(norms)
            far = bool(len(norms)) and float(np.square(c, dtype=np.float64).sum()) > (
                FAR_FROM_ORIGIN ** 2 * float(norms.max()))
            Z = self._rows_held()
            Zc = (Z - c) if far and Z is not None else None
            got = self._centred_norms = (c, norms, Zc, far)
        return got

    def block_rows(self) -> int:
        """Rows a scan reads a block at a time: `GRID_BLOCK_BYTES` of float32 rows."""
        return max(1, GRID_BLOCK_BYTES // (4 * max(1, self.shape[1])))

    def _rows_held(self) -> np.ndarray | None:
        """The float32 rows if this payload holds them or borrows them (`compact`), else None
        (held on its grid alone)."""
        if self._Z is not None:
            return self._Z
        return None if self._lent is None else self._lent()

    def _row_block(self, rows: slice) -> np.ndarray:
        """Float32 rows ``rows``: a view of the rows held or borrowed (read only), else made
        from the grid (a fresh array, not kept)."""
        Z = self._rows_held()
        if Z is not None:
            return Z[rows]
        assert self._grid is not None
        lo, step, U = self._grid
        Ub = np.ascontiguousarray(U[rows])
        out = np.empty(Ub.shape, dtype=np.float32)
        grid_rows(Ub, lo, step, out)
        return out


class KernelPayload:
    """Rows (CSR over uint64 feature ids), ``cross`` (N, c) and ``sx`` (N,).

    ``cross``: each row's factor of the kernel cross term ``k_x^T F k_q`` of a distance --
    its kernel values ``k_x`` on the database side (stored as the array ``kx``), and
    ``z_q = F k_q`` on the query side (a query payload is never stored), so that the re-rank
    multiplies a database row's by a query's (F: `ImplicitMetric.kernel_form`);
    ``sx = ||phi(x)||^2 + k_x^T F k_x``.
    """

    kind = "kernel"

    def __init__(self, indptr: ArrayLike, indices: ArrayLike, data: ArrayLike,
                 cross: ArrayLike, sx: ArrayLike):
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.uint64)
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        self.cross = np.ascontiguousarray(cross, dtype=np.float32)
        self.sx = np.ascontiguousarray(sx, dtype=np.float64)

    def prepare(self, n_threads: int = 1) -> None:
        """Number the rows' features locally (`_local`) before a search's threads share it."""
        self._local()

    def __len__(self) -> int:
        return len(self.sx)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"indptr": self.indptr, "indices": self.indices, "data": self.data,
                "kx": self.cross, "sx": self.sx}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> KernelPayload:
        """From stored arrays (`arrays`): ``indptr`` int64 (N+1,), ascending from 0 to nnz;
        ``indices`` uint64 (nnz,); ``data`` float32 (nnz,); ``kx`` float32 (N, c); ``sx``
        float64 (N,).

        Raises
        ------
        InputError
            If an array is missing, extra, of the wrong dtype or shape, or ``indptr`` does not
            delimit ``indices``.
        """
        _check_keys(a, {"indptr", "indices", "data", "kx", "sx"}, "kernel")
        indptr = _check_array(a["indptr"], "indptr", np.int64, 1)
        indices = _check_array(a["indices"], "indices", np.uint64, 1)
        data = _check_array(a["data"], "data", np.float32, 1)
        kx = _check_array(a["kx"], "kx", np.float32, 2)
        sx = _check_array(a["sx"], "sx", np.float64, 1)
        n, nnz = len(sx), len(indices)
        if len(indptr) != n + 1 or kx.shape[0] != n:
            raise InputError(f"kernel payload: indptr has {len(indptr)} entries, kx "
                             f"{kx.shape[0]} rows, sx {n}: expected N+1, N and N")
        if len(data) != nnz:
            raise InputError(f"kernel payload: data has {len(data)} entries, indices {nnz}")
        if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
            raise InputError(f"kernel payload: indptr must ascend from 0 to nnz={nnz}, got "
                             f"{indptr[0]} .. {indptr[-1]}"
                             f"{'' if np.all(np.diff(indptr) >= 0) else ' (descending steps)'}")
        return cls(indptr, indices, data, kx, sx)

    @property
    def width(self) -> float:
        """Numbers per row an exact distance reads: nonzeros on average, plus c kernel values."""
        n = max(len(self), 1)
        return float(self.indptr[-1] - self.indptr[0]) / n + float(
            self.cross.shape[1] if self.cross.ndim == 2 else 0)

    def take(self, rows: slice | np.ndarray) -> KernelPayload:
        """Rows ``rows``: a slice with step 1, or an integer array (any order)."""
        indptr, (indices, data) = csr_take(self.indptr, (self.indices, self.data), rows)
        return KernelPayload(indptr, indices, data, self.cross[rows], self.sx[rows])

    def block(self, start: int = 0, stop: int | None = None) -> SparseBlock:
        stop = len(self) if stop is None else stop
        lo, hi = self.indptr[start], self.indptr[stop]
        return SparseBlock.from_arrays(self.indptr[start : stop + 1] - lo,
                                       self.indices[lo:hi], self.data[lo:hi])

    def _local(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows over local feature numbers: (sorted unique feature ids, int32 per nonzero)."""
        if not hasattr(self, "_features"):
            features, inv = np.unique(self.indices, return_inverse=True)
            # both set before either is seen: a search's other thread tests `_features`
            self._local_idx = inv.astype(np.int32).ravel()
            self._features = features
        return self._features, self._local_idx

    def rerank(self, offsets: np.ndarray, rows: np.ndarray, query: KernelPayload, k: int,
               tiebreak: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if query.cross.shape[1] != self.cross.shape[1]:  # the kernel reads c of each query
            raise InputError(f"queries have {query.cross.shape[1]} kernel columns, the index "
                             f"{self.cross.shape[1]}: were they encoded with the index's model?")
        features, local = self._local()
        pos = np.searchsorted(features, query.indices)
        posc = np.minimum(pos, max(len(features) - 1, 0))
        hit = (pos < len(features)) & (features[posc] == query.indices) if len(features) else (
            np.zeros(len(query.indices), bool))
        qlocal = np.where(hit, posc, -1).astype(np.int32)
        dist, top = rerank_sparse(offsets, rows, self.indptr, local, self.data, len(features),
                                  self.cross, self.sx, query.indptr, qlocal, query.data,
                                  query.cross.astype(np.float64), query.sx, k, tiebreak)
        return refuse_overflow(dist, top)

    def scan_slack(self, query: KernelPayload) -> tuple[np.ndarray, np.ndarray, float]:
        """`distances` and the re-rank are float64 sums of the same terms in other orders:
        the slack scales with ``|s_x| + |s_q| + 2 (|x| |q| + |k_x| |z_q|)`` at its largest."""
        sx_max, x_max, kx_max = self._magnitudes()
        q_norm = np.sqrt(query.block().row_norms_sq())
        kq_norm = (np.linalg.norm(query.cross.astype(np.float64), axis=1) if query.cross.size
                   else 0.0)
        scale = sx_max + np.abs(query.sx) + 2.0 * (x_max * q_norm + kx_max * kq_norm)
        return np.zeros(len(query)), f64_slack(scale), REL_F64_PAYLOAD

    def _magnitudes(self) -> tuple[float, float, float]:
        """``(max |s_x|, max |x|, max |k_x|)`` over the rows, made once."""
        got = getattr(self, "_mags", None)
        if got is None:
            x2 = self.block().row_norms_sq() if len(self) else np.zeros(1)
            kx = np.linalg.norm(self.cross.astype(np.float64), axis=1) if self.cross.size else (
                np.zeros(1))
            sx = np.abs(self.sx) if len(self) else np.zeros(1)
            got = self._mags = (float(sx.max()), float(np.sqrt(x2.max())), float(kx.max()))
        return got

    def distances(self, query: KernelPayload) -> np.ndarray:
        """Distances from the queries to all rows, float64 (Q, N)."""
        if not hasattr(self, "_block"):
            self._block = self.block()
        dot = query.block().dot_t(self._block)
        dot += query.cross.astype(np.float64) @ self.cross.astype(np.float64).T
        D: np.ndarray = np.maximum(self.sx[None, :] + query.sx[:, None] - 2 * dot, 0.0)
        return D


def csr_take(indptr: np.ndarray, values: tuple[np.ndarray, ...], rows: slice | np.ndarray
             ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Rows ``rows`` of CSR arrays (``indptr`` and per-nonzero ``values``): a slice with step
    1 (views), or an integer array in any order (a gather)."""
    if isinstance(rows, slice):
        start, stop, step = rows.indices(len(indptr) - 1)
        if step != 1:
            raise InputError("a CSR payload takes a contiguous slice or an index array")
        lo, hi = indptr[start], indptr[stop]
        return indptr[start: stop + 1] - lo, tuple(v[lo:hi] for v in values)
    rows = np.asarray(rows, dtype=np.int64)
    lengths = indptr[rows + 1] - indptr[rows]
    out_ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_ptr[1:])
    # the source position of every output nonzero: its row's start plus its rank in the row
    src = np.repeat(indptr[rows] - out_ptr[:-1], lengths) + np.arange(out_ptr[-1])
    return out_ptr, tuple(v[src] for v in values)


def _check_keys(a: dict[str, np.ndarray], expected: set[str], kind: str) -> None:
    if set(a) != expected:
        raise InputError(f"a {kind} payload has arrays {sorted(expected)}, got {sorted(a)}")


def _check_array(a: np.ndarray, name: str, dtype: type, ndim: int) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != dtype or a.ndim != ndim:
        raise InputError(f"payload array {name!r} must be {ndim}-d {np.dtype(dtype)}, got "
                         f"{a.ndim}-d {a.dtype}")
    return a
