"""Permutation-list search (Charikar 2002): window lookups, candidate sets, exact re-rank."""

import numpy as np
from numba import njit

from lshdist._kernels.hashing import hamming
from lshdist._kernels.prefetch import prefetch


@njit(cache=True, nogil=True)
def window_positions_bsearch(sorted_prefix, qprefix):
    """Per-query binary search: each query's place in each list (``searchsorted``, side
    'left'): int64 (Q, M).

    sorted_prefix : uint64 (M, N); qprefix : uint64 (M, Q).
    """
    M = sorted_prefix.shape[0]
    Q = qprefix.shape[1]
    pos = np.empty((Q, M), dtype=np.int64)
    for q in range(Q):
        for m in range(M):
            pos[q, m] = np.searchsorted(sorted_prefix[m], qprefix[m, q])  # side='left'
    return pos


@njit(cache=True, nogil=True)
def window_positions_merge(sorted_prefix, qprefix, qorder):
    """Bulk lookup by sort-merge: the queries, sorted under each permutation (``qorder``
    (M, Q)), are merged with the sorted list in one sequential pass.  Same output as
    `window_positions_bsearch`."""
    M, N = sorted_prefix.shape
    Q = qprefix.shape[1]
    pos = np.empty((Q, M), dtype=np.int64)
    for m in range(M):
        ptr = 0
        lst = sorted_prefix[m]
        for t in range(Q):
            q = qorder[m, t]
            v = qprefix[m, q]
            while ptr < N and lst[ptr] < v:
                ptr += 1
            pos[q, m] = ptr
    return pos


@njit(cache=True, nogil=True)
def window_candidates(pos, sorted_rows, W):
    """The raw window entries: per query and list the W rows left of its place ``pos[q, m]``
    and the W from it on, (Q, M*2W) of sorted_rows' dtype (int32 for any segment below 2**31
    rows), -1 where a window runs past an end of a list.  What calibration's grid walks; the
    search itself reads the windows in place (`collect_windows`)."""
    Q, M = pos.shape
    N = sorted_rows.shape[1]
    out = np.full((Q, M * 2 * W), -1, dtype=sorted_rows.dtype)
    for q in range(Q):
        for m in range(M):
            base = m * 2 * W
            lo = pos[q, m] - W
            for t in range(2 * W):
                j = lo + t
                if 0 <= j < N:
                    out[q, base + t] = sorted_rows[m, j]
    return out


@njit(cache=True, nogil=True)
def _hamming_cut(buf, n, codes, qcode, keep, ham, hist, out, at):
    """Write the ``keep`` rows of ``buf[:n]`` nearest ``qcode`` in Hamming distance of the full
    keys, ties in ``buf``'s order, to ``out[at:at + keep]`` (a counting selection, O(n + b));
    the rows' keys are prefetched 16 rows ahead (random rows of ``codes``, latency-bound)."""
    hist[:] = 0
    for t in range(n):
        if t + 16 < n:
            prefetch(codes, buf[t + 16])
        h = hamming(codes[buf[t]], qcode)
        ham[t] = h
        hist[h] += 1
    cut = 0
    total = hist[0]
    while total < keep:
        cut += 1
        total += hist[cut]
    room_at_cut = keep - (total - hist[cut])
    j = 0
    for t in range(n):
        h = ham[t]
        if h < cut or (h == cut and room_at_cut > 0):
            if h == cut:
                room_at_cut -= 1
            out[at + j] = buf[t]
            j += 1


@njit(cache=True, nogil=True)
def _collect_buffers(Q, T, width, words):
    """Outputs and scratch of the candidate collectors: rows (Q * width,), offsets (Q+1,),
    distinct (Q,), and per query buf, ham (T,) and the Hamming histogram (64 words + 1)."""
    return (np.empty(Q * width, dtype=np.int64), np.zeros(Q + 1, dtype=np.int64),
            np.zeros(Q, dtype=np.int64), np.empty(T, dtype=np.int64),
            np.empty(T, dtype=np.int64), np.zeros(words * 64 + 1, dtype=np.int64))


@njit(cache=True, nogil=True)
def collect_windows(pos, sorted_rows, W, codes, qcodes, keep):
    """The search's candidates, read from the lists in place: what `collect_candidates` gives
    for ``window_candidates(pos, sorted_rows, W)``, without writing that (Q, 2 M W) array
    and reading it back (tested equal).  De-duplication is branch-free (a stamp written for
    every entry, the count advanced by the comparison); each list's window is prefetched
    four lists ahead.  Queries per call below 2**31 (the stamps are int32).

    Returns offsets int64 (Q+1,), rows int64 (offsets[-1],), distinct int64 (Q,).
    """
    Q, M = pos.shape
    N = codes.shape[0]
    T = M * 2 * W
    mark = np.full(N, -1, dtype=np.int32)  # half the bytes of int64: more of it stays in L2
    width = min(T, N) if keep <= 0 else min(T, N, keep)
    rows, offsets, distinct, buf, ham, hist = _collect_buffers(Q, T, width, codes.shape[1])
    at = 0
    for q in range(Q):
        n = 0
        stamp = np.int32(q)
        for m in range(M):
            if m + 4 < M:  # the next windows' first and last entries (2-3 cache lines)
                p = pos[q, m + 4]
                prefetch(sorted_rows[m + 4], max(p - W, 0))
                prefetch(sorted_rows[m + 4], max(min(p + W, N) - 1, 0))
            p = pos[q, m]
            lst = sorted_rows[m]
            for j in range(max(p - W, 0), min(p + W, N)):
                v = lst[j]
                new = mark[v] != stamp
                mark[v] = stamp
                buf[n] = v
                n += new
        distinct[q] = n
        if 0 < keep < n:
            _hamming_cut(buf, n, codes, qcodes[q], keep, ham, hist, rows, at)
            n = keep
        else:
            rows[at:at + n] = buf[:n]
        at += n
        offsets[q + 1] = at
    return offsets, rows[:at].copy(), distinct


@njit(cache=True, nogil=True)
def collect_candidates(cand, codes, qcodes, keep):
    """De-duplicate each query's candidates; optionally keep the ``keep`` nearest in Hamming
    distance of the full keys (0 keeps all).

    Candidates keep the order in which the lists found them (a stamp array, O(1) per entry,
    instead of a sort); the Hamming selection keeps the ``keep`` smallest distances, ties in
    that order, so the result depends only on the query's candidate row.  The search reads
    its windows in place (`collect_windows`, the same cut); this form takes any candidate
    array (the reference of calibration's grid and of the tests).

    Returns offsets int64 (Q+1,), rows int64 (offsets[-1],), distinct int64 (Q,).
    """
    Q, T = cand.shape
    N = codes.shape[0]
    mark = np.full(N, -1, dtype=np.int64)
    rows, offsets, distinct, buf, ham, hist = _collect_buffers(Q, T, min(T, N), codes.shape[1])
    pos = 0
    for q in range(Q):
        n = 0
        for t in range(T):
            v = cand[q, t]
            if v >= 0 and mark[v] != q:
                mark[v] = q
                buf[n] = v
                n += 1
        distinct[q] = n
        if 0 < keep < n:
            _hamming_cut(buf, n, codes, qcodes[q], keep, ham, hist, rows, pos)
            n = keep
        else:
            for t in range(n):
                rows[pos + t] = buf[t]
        pos += n
        offsets[q + 1] = pos
    return offsets, rows[:pos].copy(), distinct


@njit(cache=True, nogil=True)
def _topk(dist, rows, k, out_d, out_r, q, tiebreak):
    """Smallest k of ``dist`` (float32-rounded), ties by ``tiebreak[row]`` (the row ids), so
    that the result does not depend on the order candidates were found in.  With many
    candidates only those at or below the k-th smallest value are sorted (a selection first:
    the sorted prefix is the same)."""
    n = dist.shape[0]
    d32 = dist.astype(np.float32)
    if n > 4 * k and k > 0:
        kth = np.partition(d32, k - 1)[k - 1]
        m = 0
        for t in range(n):
            if d32[t] <= kth:
                m += 1
        sel = np.empty(m, dtype=np.int64)
        m = 0
        for t in range(n):
            if d32[t] <= kth:
                sel[m] = t
                m += 1
        d32 = d32[sel]
        rows = rows[sel]
        n = m
    by_id = np.argsort(tiebreak[rows], kind="mergesort")
    order = by_id[np.argsort(d32[by_id], kind="mergesort")]
    for t in range(min(k, n)):
        out_d[q, t] = d32[order[t]]
        out_r[q, t] = rows[order[t]]


@njit(cache=True, nogil=True)
def _prefetch_row(row):
    """Prefetch every cache line of a contiguous 1-d row."""
    step = max(1, 64 // row.itemsize)
    for c in range(0, row.shape[0], step):
        prefetch(row, c)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sq_dist_f32(a, b):
    s = np.float32(0.0)
    for j in range(a.shape[0]):
        diff = a[j] - b[j]
        s += diff * diff
    return s


@njit(cache=True, nogil=True)
def rerank_dense(offsets, rows, Z, Zq, k, tiebreak):
    """Exact ``||z - z_q||^2`` of every candidate, top-k ascending (ties by row).

    Z : float32 (N, d) database payload (``Gx`` or ``x``); Zq : float32 (Q, d);
    tiebreak : int64 (N,), the row ids (equal distances are ordered by id).
    Returns float32 (Q, k) distances (inf padded) and int64 (Q, k) rows (-1 padded).
    """
    Q = Zq.shape[0]
    out_d = np.full((Q, k), np.inf, dtype=np.float32)
    out_r = np.full((Q, k), -1, dtype=np.int64)
    for q in range(Q):
        lo, hi = offsets[q], offsets[q + 1]
        r = rows[lo:hi]
        dist = np.empty(hi - lo)
        zq = Zq[q]
        for t in range(hi - lo):
            dist[t] = _sq_dist_f32(Z[r[t]], zq)
        _topk(dist, r, k, out_d, out_r, q, tiebreak)
    return out_d, out_r


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def centred_sq_norms(Z, c):
    """``||z - c||^2`` of every row of ``Z`` (float32 (N, d)) about ``c`` (float32 (d,)):
    float32 (N,), summed in float32 lanes (relative error ~d u, far below the float32 scores it
    is added to).  One pass: the numpy form (``Z - c``, then a row sum) made an (N, d)
    temporary and took 6x longer at 60,000 x 784."""
    n, d = Z.shape
    out = np.empty(n, dtype=np.float32)
    for i in range(n):
        s = np.float32(0.0)
        for j in range(d):
            t = Z[i, j] - c[j]
            s += t * t
        out[i] = s
    return out


@njit(cache=True, nogil=True)
def column_bounds(Z, start, stop):
    """Column minima and maxima (float32 (d,) each) of rows ``start:stop`` of ``Z``; +inf and
    -inf for no rows.  The bounds of a row range are the element-wise min / max of its parts'
    (`quantize_rows` in parts, on threads)."""
    d = Z.shape[1]
    lo = np.empty(d, dtype=np.float32)
    hi = np.empty(d, dtype=np.float32)
    for j in range(d):
        lo[j] = np.inf
        hi[j] = -np.inf
    for r in range(start, stop):
        for j in range(d):
            v = Z[r, j]
            if v < lo[j]:
                lo[j] = v
            if v > hi[j]:
                hi[j] = v
    return lo, hi


@njit(cache=True, nogil=True)
def grid_steps(lo, hi, n):
    """``step`` float32 (d,) ``(hi - lo) / 255`` (0 for a constant column or no rows) and its
    float64 inverse (0 where the step is 0)."""
    d = lo.shape[0]
    step = np.zeros(d, dtype=np.float32)
    inv = np.zeros(d)
    for j in range(d):
        if n > 0 and hi[j] > lo[j]:
            step[j] = np.float32((np.float64(hi[j]) - np.float64(lo[j])) / 255.0)
            if step[j] > 0:
                inv[j] = 1.0 / np.float64(step[j])
    return step, inv


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def quantize_block(Z, lo, step, inv, U, err, start, stop):
    """Rows ``start:stop`` of ``Z`` onto the grid ``lo + step u``: fills ``U`` and ``err``
    there (see `quantize_rows`) and returns those rows' largest ``||z||`` and ``||step u||``."""
    d = Z.shape[1]
    lo64 = lo.astype(np.float64)
    step64 = step.astype(np.float64)
    uf = np.empty(d)
    z_max = 0.0
    g_max = 0.0
    for r in range(start, stop):
        e = 0.0
        zn = 0.0
        gn = 0.0
        for j in range(d):
            z = np.float64(Z[r, j])
            u = np.floor((z - lo64[j]) * inv[j] + 0.5)
            u = 0.0 if u < 0.0 else (255.0 if u > 255.0 else u)
            uf[j] = u
            g = step64[j] * u
            diff = (z - lo64[j]) - g
            e += diff * diff
            zn += z * z
            gn += g * g
        for j in range(d):
            U[r, j] = np.uint8(uf[j])
        err[r] = np.sqrt(e)
        z_max = max(z_max, np.sqrt(zn))
        g_max = max(g_max, np.sqrt(gn))
    return z_max, g_max


@njit(cache=True, nogil=True)
def quantize_rows(Z):
    """Rows of ``Z`` float32 (N, d) on a per-column uint8 grid for a first, approximate pass of
    the re-rank (`rerank_dense_quantized`): ``lo`` float32 (d,) the column minima, ``step``
    float32 (d,) ``(max - min) / 255`` (0 for a constant column), ``U`` uint8 (N, d) with
    ``Z ~ lo + step U`` (rounded to the nearest step), ``err`` float64 (N,) each row's
    exact distance to its grid point, ``||z - (lo + step u)||`` in float64 (at most
    ``||step|| / 2``), and ``scale`` (float64) ``max |z| + |lo| + max |step u|``, which bounds
    every magnitude the two distance sums meet apart from the query's.  In one piece; the
    payload runs the same three steps on row ranges in parallel (the same result)."""
    N, d = Z.shape
    lo, hi = column_bounds(Z, 0, N)
    step, inv = grid_steps(lo, hi, N)
    U = np.zeros((N, d), dtype=np.uint8)
    err = np.zeros(N)
    z_max, g_max = quantize_block(Z, lo, step, inv, U, err, 0, N)
    return lo, step, U, err, grid_scale(lo, z_max, g_max)


@njit(cache=True, nogil=True)
def grid_scale(lo, z_max, g_max):
    """``max |z| + |lo| + max |step u|`` (`quantize_rows`' ``scale``), ``|lo|`` in float64."""
    lo_norm = 0.0
    for j in range(lo.shape[0]):
        lo_norm += np.float64(lo[j]) * np.float64(lo[j])
    return z_max + np.sqrt(lo_norm) + g_max


@njit(cache=True, nogil=True)
def grid_floor(lo, hi):
    """1/255 of the widest column's span (`exact_grid`: a positive step below it cannot be
    a uint8 grid's unit)."""
    span = 0.0
    for j in range(lo.shape[0]):
        span = max(span, np.float64(hi[j]) - np.float64(lo[j]))
    return span / 255.0


@njit(cache=True, nogil=True)
def grid_unit_block(Z, lo, floor, a, b):
    """The smallest positive ``Z - lo`` over rows ``a:b`` (inf if none), or -1 when one is
    below ``floor`` (no uint8 grid: real-valued rows fail within their first 64 rows).

    Per column, in float32, the rows' minima kept in a (d,) vector: the inner loop runs over
    the columns without a dependency between them, so it vectorises (30,000 x 784 Fashion-MNIST
    rows: 14 ms against 48 for a float64 minimum per row).  The float32 differences decide
    nothing a float64 one would not: rows that `grid_fill_block` accepts with unit g are
    exactly ``lo + g u`` with ``g u`` a float32 number (`grid_table_exact`), so each ``z - lo``
    is that number and float32 subtraction returns it exactly -- both compute the same unit;
    rows off every grid fail the fill whatever unit they are given."""
    d = Z.shape[1]
    inf = np.float32(np.inf)
    zero = np.float32(0.0)
    m = np.full(d, inf, dtype=np.float32)
    for r in range(a, b):
        for j in range(d):
            t = Z[r, j] - lo[j]
            t = t if t > zero else inf
            m[j] = t if t < m[j] else m[j]
        if (r - a) & 63 == 0 and d and np.float64(m.min()) < floor:
            return -1.0
    g = np.float64(m.min()) if d else np.inf
    return -1.0 if g < floor else g


@njit(cache=True, nogil=True)
def grid_fill_block(Z, lo, g, a, b, U, umax):
    """Rows ``a:b`` of ``Z`` as ``u = (z - lo) / g`` into uint8 ``U``, their largest u per
    column into ``umax`` (d,); False as soon as a row has an entry that is not exactly
    ``lo + g u`` with u <= 255 (checked in float64, where ``g u`` is exact: 24 bits times
    8)."""
    d = Z.shape[1]
    inv = 1.0 / g
    for r in range(a, b):
        bad = False
        for j in range(d):
            l64 = np.float64(lo[j])
            z = np.float64(Z[r, j])
            u = min(max(np.floor((z - l64) * inv + 0.5), 0.0), 256.0)
            bad |= (u > 255.0) | (l64 + g * u != z)
            v = np.uint8(u) if u <= 255.0 else np.uint8(0)  # NaN (rejected) to 0, defined
            U[r, j] = v
            umax[j] = max(umax[j], v)
        if bad:
            return False
    return True


@njit(cache=True, nogil=True)
def grid_unit(g):
    """The unit of a grid whose smallest positive step is ``g`` (inf: constant columns, 1),
    or -1 when that is not a float32 number."""
    if not np.isfinite(g):
        return 1.0
    if np.float64(np.float32(g)) != g:
        return -1.0
    return g


@njit(cache=True, nogil=True)
def exact_grid(Z, lo, hi):
    """Whether float32 rows ``Z`` (N, d) are exactly ``lo + g u`` for one unit ``g`` and uint8
    ``u`` (pixels, counts and their power-of-two multiples): ``(ok, g, U)`` with ``U`` uint8
    (N, d) when ok (else an empty array).  ``lo``, ``hi``: `column_bounds` of ``Z``.  In one
    piece; the payload runs the same steps on row ranges in parallel (the same result,
    `lshdist.index.payload.exact_grid_parallel`).

    ``g`` is the smallest positive step above a column's minimum (1 for constant columns).
    Accepted only if every entry is ``lo + g u`` with u at most 255 and ``g u`` and
    ``lo + g u`` are float32 numbers for every u up to a column's largest
    (`grid_table_exact`: float32 arithmetic in any order, fused or not, rebuilds the entry
    exactly, `grid_row`).  Rows off such a grid fail at their first row with an entry
    below 1/255 of the widest column's span (real-valued rows within microseconds)."""
    N, d = Z.shape
    g = grid_unit_block(Z, lo, grid_floor(lo, hi), 0, N)
    empty = np.empty((0, d), dtype=np.uint8)
    if g < 0.0:
        return False, g, empty
    g = grid_unit(g)
    if g < 0.0:
        return False, g, empty
    U = np.empty((N, d), dtype=np.uint8)
    umax = np.zeros(d, dtype=np.uint8)
    if not grid_fill_block(Z, lo, g, 0, N, U, umax) or not grid_table_exact(
            lo, np.full(d, np.float32(g)), umax):
        return False, g, empty
    return True, g, U


@njit(cache=True, nogil=True)
def byte_grid_unit(U, lo):
    """The smallest positive ``u - lo_j`` over uint8 rows ``U`` (N, d) whose column minima are
    ``lo`` (uint8 (d,)), 0 when there is none (every column constant): `exact_grid`'s unit of
    the same rows in float32.  Per column, the minima kept in a (d,) vector (the inner loop
    over the columns vectorises, as `grid_unit_block`'s)."""
    d = U.shape[1]
    m = np.full(d, 256, dtype=np.int32)
    for r in range(U.shape[0]):
        for j in range(d):
            t = np.int32(U[r, j]) - np.int32(lo[j])
            m[j] = t if (t > 0) & (t < m[j]) else m[j]
    g = 256
    for j in range(d):
        g = min(g, m[j])
    return 0 if g == 256 else g


@njit(cache=True, nogil=True)
def byte_grid_fill(U, lo, g, out):
    """``out = (U - lo) / g`` for uint8 rows ``U`` (column minima ``lo``, unit ``g`` > 1);
    False when some ``u - lo_j`` is not a multiple of ``g`` (no exact grid of that unit)."""
    ok = True
    for r in range(U.shape[0]):
        for j in range(U.shape[1]):
            t = np.int32(U[r, j]) - np.int32(lo[j])
            ok &= t % g == 0
            out[r, j] = np.uint8(t // g)
    return ok


@njit(cache=True, nogil=True)
def grid_row(U, lo, step, r, out):
    """Row ``r`` of an exact grid (`exact_grid`) into float32 ``out`` (d,): ``lo + step u``,
    each entry the stored float32 number exactly."""
    for j in range(out.shape[0]):
        out[j] = lo[j] + step[j] * np.float32(U[r, j])
    return out


@njit(cache=True, nogil=True)
def grid_rows(U, lo, step, out):
    """Every row of an exact grid into ``out`` float32 (N, d)."""
    for r in range(U.shape[0]):
        grid_row(U, lo, step, r, out[r])


@njit(cache=True, nogil=True)
def grid_table_exact(lo, step, umax):
    """Whether ``step u`` and ``lo + step u`` are float32 numbers for every column j and every
    ``u <= umax[j]`` (so float32 arithmetic in any order, fused or not, rebuilds them)."""
    for j in range(lo.shape[0]):
        l64 = np.float64(lo[j])
        s64 = np.float64(step[j])
        for u in range(np.int64(umax[j]) + 1):
            p = s64 * u  # exact in float64: a 24-bit step times an 8-bit u
            z = l64 + p
            if np.float64(np.float32(p)) != p or np.float64(np.float32(z)) != z:
                return False
    return True


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _grid_norms_pass(U, lo, step, umax):
    N, d = U.shape
    z_max = 0.0
    g_max = 0.0
    for r in range(N):
        zn = 0.0
        gn = 0.0
        for j in range(d):
            u = U[r, j]
            umax[j] = max(umax[j], u)
            g = np.float64(step[j]) * np.float64(u)
            z = np.float64(lo[j]) + g
            zn += z * z
            gn += g * g
        z_max = max(z_max, np.sqrt(zn))
        g_max = max(g_max, np.sqrt(gn))
    return z_max, g_max


@njit(cache=True, nogil=True)
def grid_norms(U, lo, step):
    """``(exact, max ||z||, max ||step u||)`` in float64 over the rows ``z = lo + step u`` of
    a grid (`quantize_rows`' scale terms, for a payload held on its exact grid; the norms'
    float64 rounding is far below the float32 slack they feed); ``exact``: `grid_table_exact`
    up to each column's largest u (`exact_grid`'s test)."""
    umax = np.zeros(U.shape[1], dtype=np.uint8)
    z_max, g_max = _grid_norms_pass(U, lo, step, umax)
    return grid_table_exact(lo, step, umax), z_max, g_max


@njit(cache=True, nogil=True)
def _exact_sq(Z, U, lo, step, row, zq, buf):
    """`_sq_dist_f32` of database row ``row`` and ``zq``: from ``Z``, or, for a payload held
    only on its exact grid (``Z`` of no rows), from the row rebuilt into ``buf`` — the same
    float32 numbers, so the same result bit for bit."""
    if Z.shape[0] == 0:
        return _sq_dist_f32(grid_row(U, lo, step, row, buf), zq)
    return _sq_dist_f32(Z[row], zq)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _grid_dists(a, step, U, r, out):
    """``out[t] = ||a - step u_{r[t]}||^2`` in float32, four rows per pass over the columns so
    that four rows' memory loads are in flight at once (the pass is latency-bound: measured
    on 160 random rows of 60,000, a third faster than one row at a time), the next four rows
    prefetched meanwhile (a third faster again on a 100,000-row segment).  The summation
    order varies with a row's slot; the callers only need a bound (`rerank_dense_quantized`
    allows for any order's rounding)."""
    n = r.shape[0]
    d = a.shape[0]
    t = 0
    for i in range(min(4, n)):
        _prefetch_row(U[r[i]])
    while t + 4 <= n:
        u0, u1, u2, u3 = U[r[t]], U[r[t + 1]], U[r[t + 2]], U[r[t + 3]]
        for i in range(t + 4, min(t + 8, n)):  # the next four rows' lines, while these compute
            _prefetch_row(U[r[i]])
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        for j in range(d):
            aj = a[j]
            sj = step[j]
            e0 = aj - sj * np.float32(u0[j])
            e1 = aj - sj * np.float32(u1[j])
            e2 = aj - sj * np.float32(u2[j])
            e3 = aj - sj * np.float32(u3[j])
            s0 += e0 * e0
            s1 += e1 * e1
            s2 += e2 * e2
            s3 += e3 * e3
        out[t] = s0
        out[t + 1] = s1
        out[t + 2] = s2
        out[t + 3] = s3
        t += 4
    for i in range(t, n):
        ui = U[r[i]]
        s = np.float32(0.0)
        for j in range(d):
            e = a[j] - step[j] * np.float32(ui[j])
            s += e * e
        out[i] = s


@njit(cache=True, nogil=True)
def rerank_dense_quantized(offsets, rows, Z, Zq, k, tiebreak, lo, step, U, err, scale):
    """`rerank_dense`'s answer, exactly, reading most candidates on the uint8 grid.

    Per query with more than ``4 k`` candidates: ``e_t = ||zq - (lo + step u_t)||`` from the
    uint8 rows (a quarter of the bytes), which is within ``err[t]`` of the exact ``||zq -
    z_t||`` (triangle inequality), widened by ``tau``, a bound on float32 rounding in either
    sum.  Every candidate whose lower bound ``e_t - err_t - tau`` is at most the k-th smallest
    upper bound ``e_t + err_t + tau`` gets its exact float32 distance (`_sq_dist_f32`, as
    `rerank_dense`); every other one is farther than k candidates that do, so it cannot be in
    the top k, ties included.  The result is bit-for-bit `rerank_dense`'s.

    lo, step, U, err, scale : `quantize_rows` of Z.  ``Z`` of no rows: the payload is held
    only on its exact grid (`exact_grid`; ``err`` zero), from which the exact pass rebuilds
    each row it reads.
    Returns (float32 (Q, k), int64 (Q, k)) as `rerank_dense`, and int64 (Q,) the candidates
    whose exact distance was computed.
    """
    Q, d = Zq.shape
    out_d = np.full((Q, k), np.inf, dtype=np.float32)
    out_r = np.full((Q, k), -1, dtype=np.int64)
    exact = np.zeros(Q, dtype=np.int64)
    a = np.empty(d, dtype=np.float32)
    grid = np.empty(rows.shape[0], dtype=np.float32)
    buf = np.empty(d, dtype=np.float32)
    held = Z.shape[0] > 0
    u32 = 2.0 ** -24
    for q in range(Q):
        lo_q, hi_q = offsets[q], offsets[q + 1]
        n = hi_q - lo_q
        r = rows[lo_q:hi_q]
        zq = Zq[q]
        if n <= 4 * k:
            dist = np.empty(n)
            for t in range(n):
                dist[t] = _exact_sq(Z, U, lo, step, r[t], zq, buf)
            exact[q] = n
            _topk(dist, r, k, out_d, out_r, q, tiebreak)
            continue
        qn = 0.0
        for j in range(d):
            a[j] = zq[j] - lo[j]
            qn += np.float64(zq[j]) * np.float64(zq[j])
        # float32 rounding, in distance units: a difference is off by at most ~2u of the
        # magnitudes involved, a sum of d squares by (d + 2) u relative; 4x that, generously
        tau = 4.0 * (d + 4) * u32 * (np.sqrt(qn) + scale)
        low = np.empty(n)
        up = np.empty(n)
        _grid_dists(a, step, U, r, grid)
        for t in range(n):
            e = np.sqrt(np.float64(grid[t]))
            slack = err[r[t]] + tau
            low[t] = e - slack
            up[t] = e + slack
        kth = np.partition(up, k - 1)[k - 1]
        m = 0
        for t in range(n):
            if low[t] <= kth:
                m += 1
                if held:  # the exact pass's float32 rows, all in flight at once
                    _prefetch_row(Z[r[t]])
        sel_rows = np.empty(m, dtype=rows.dtype)
        dist = np.empty(m)
        m = 0
        for t in range(n):
            if low[t] <= kth:
                sel_rows[m] = r[t]
                dist[m] = _exact_sq(Z, U, lo, step, r[t], zq, buf)
                m += 1
        exact[q] = m
        _topk(dist, sel_rows, k, out_d, out_r, q, tiebreak)
    return out_d, out_r, exact


@njit(cache=True, nogil=True)
def sparse_dot(indptr, local, data, qdense, i):
    """``x_i^T q`` for CSR row ``i`` (local feature numbers) and a query scattered into
    ``qdense``: a branch-free gather over the row's nonzeros, in float64."""
    s = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        s += np.float64(data[p]) * qdense[local[p]]
    return s


@njit(cache=True, nogil=True)
def scatter_query(qdense, qindptr, qlocal, qdata, q, clear):
    """Write query ``q``'s nonzeros into the dense buffer ``qdense`` at their local feature
    numbers (``qlocal``, -1: a feature no database row has, skipped); with ``clear`` write
    zeros there instead, leaving the buffer clean for the next query."""
    for j in range(qindptr[q], qindptr[q + 1]):
        if qlocal[j] >= 0:
            qdense[qlocal[j]] = 0.0 if clear else qdata[j]


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def rerank_sparse(offsets, rows, indptr, local, data, n_features, kx, sx, qindptr, qlocal, qdata,
                  zq, sq, k, tiebreak):
    """Exact implicit learned distance of every candidate, top-k ascending.

    ``d = sx[i] + sq[q] - 2 (x_i^T q + kx[i]^T zq[q])`` where ``sx = ||x||^2 + k_x^T F k_x``,
    ``zq = F k_q``.  Database rows are CSR over *local* feature numbers ``local`` (0 ..
    n_features-1); ``qlocal`` maps each query entry to the same numbering (-1: a feature no
    database row has).  Each query is scattered once into a dense buffer, so ``x_i^T q`` is a
    branch-free gather over the candidate's nonzeros.
    """
    Q = sq.shape[0]
    c = kx.shape[1]
    out_d = np.full((Q, k), np.inf, dtype=np.float32)
    out_r = np.full((Q, k), -1, dtype=np.int64)
    qdense = np.zeros(n_features, dtype=np.float64)
    for q in range(Q):
        scatter_query(qdense, qindptr, qlocal, qdata, q, False)
        lo, hi = offsets[q], offsets[q + 1]
        r = rows[lo:hi]
        dist = np.empty(hi - lo)
        for t in range(hi - lo):
            i = r[t]
            s = sparse_dot(indptr, local, data, qdense, i)
            for j in range(c):
                s += np.float64(kx[i, j]) * zq[q, j]
            dist[t] = max(sx[i] + sq[q] - 2.0 * s, 0.0)
        scatter_query(qdense, qindptr, qlocal, qdata, q, True)
        _topk(dist, r, k, out_d, out_r, q, tiebreak)
    return out_d, out_r


@njit(cache=True, nogil=True)
def scan_thresholds(D, k, kk, offset, slack, rel, cap):
    """Per row of scores ``D`` (Q, N): the largest score a row among the true k nearest can
    have, how many entries reach it, and the first of them — ``(thr float64 (Q,), counts
    int64 (Q,), buf int64 (Q, cap))``.

    A score is within ``slack[q]`` of its exact value, score + ``offset[q]`` is the distance,
    and the re-rank's own distances are within a factor ``1 +- rel`` of it.  With v_k the
    k-th smallest score, k rows have distances at most v_k + offset + slack, so a row whose
    score exceeds ``v_k + 2 slack + 2 rel (v_k + offset + slack) / (1 - rel)`` has a re-ranked
    distance above theirs and cannot be among the k nearest, ties included.  The threshold is
    at least the ``kk``-th smallest score (``kk`` >= k rows are always kept).

    ``buf[q, :min(counts[q], cap)]``: the columns at or below the threshold, ascending (-1
    after them).  One pass keeps the kk smallest scores with their columns; a second pass over
    the row (still in cache) is made only where the threshold lies above the kk-th score, or a
    score equal to it was passed over (`rows_within` reads a row again only where more than
    ``cap`` qualify).
    """
    Q, N = D.shape
    k = min(k, N)
    kk = max(k, min(kk, N))
    thr = np.empty(Q, dtype=np.float64)
    counts = np.zeros(Q, dtype=np.int64)
    buf = np.full((Q, cap), -1, dtype=np.int64)
    vals = np.empty(kk, dtype=np.float64)
    idx = np.empty(kk, dtype=np.int64)
    for q in range(Q):
        if N == 0:
            thr[q] = -np.inf
            continue
        n = 0
        tie = False  # a score equal to the buffer's largest was passed over
        row = D[q]
        for j in range(N):  # the kk smallest scores and their columns, ascending
            v = np.float64(row[j])
            if n < kk:
                t = n
                n += 1
            elif v < vals[kk - 1]:
                t = kk - 1
                tie = vals[kk - 2] == vals[kk - 1] if kk > 1 else False
            else:
                tie = tie or v == vals[kk - 1]
                continue
            while t > 0 and vals[t - 1] > v:
                vals[t] = vals[t - 1]
                idx[t] = idx[t - 1]
                t -= 1
            vals[t] = v
            idx[t] = j
        vk = vals[k - 1]
        scale = max(vk + offset[q], 0.0) + slack[q]
        t_q = max(vals[kk - 1], vk + 2.0 * slack[q] + 2.0 * rel * scale / (1.0 - rel))
        if not t_q >= vals[kk - 1]:  # NaN: scores or bounds overflowed -- keep every row
            t_q = np.inf
        thr[q] = t_q
        if t_q == vals[kk - 1] and not tie:  # exactly the kk kept
            cols = np.sort(idx)
            m = min(kk, cap)
            buf[q, :m] = cols[:m]
            counts[q] = kk
            continue
        c = 0
        for j in range(N):
            if np.float64(row[j]) <= t_q:
                if c < cap:
                    buf[q, c] = j
                c += 1
        counts[q] = c
    return thr, counts, buf


@njit(cache=True, nogil=True)
def count_within(D, thr):
    """How many entries of each row of ``D`` are at most ``thr[q]``, int64 (Q,) (the same
    test as `rows_within`)."""
    Q, N = D.shape
    counts = np.zeros(Q, dtype=np.int64)
    for q in range(Q):
        row = D[q]
        t_q = thr[q]
        c = 0
        for j in range(N):
            if np.float64(row[j]) <= t_q:
                c += 1
        counts[q] = c
    return counts


@njit(cache=True, nogil=True)
def rows_within(D, thr, total):
    """The columns of each row of ``D`` whose score is at most ``thr[q]``, ascending, as CSR:
    ``(offsets int64 (Q+1,), rows int64 (total,))`` (``total``: their number, from
    `scan_thresholds`)."""
    Q, N = D.shape
    offsets = np.zeros(Q + 1, dtype=np.int64)
    rows = np.empty(total, dtype=np.int64)
    at = 0
    for q in range(Q):
        row = D[q]
        t_q = thr[q]
        for j in range(N):
            if np.float64(row[j]) <= t_q and at < total:  # the same test as the count
                rows[at] = j
                at += 1
        offsets[q + 1] = at
    return offsets, rows


@njit(cache=True, nogil=True)
def candidate_hamming(full, codes, qcodes):
    """Hamming distance of the full keys of every window entry to its query, int32 (Q, M, T)
    (-1 where the entry is -1), computed once for the whole calibration grid."""
    Q, M, T = full.shape
    out = np.full((Q, M, T), -1, dtype=np.int32)
    for q in range(Q):
        for m in range(M):
            for t in range(T):
                v = full[q, m, t]
                if v >= 0:
                    out[q, m, t] = hamming(codes[v], qcodes[q])
    return out


@njit(cache=True, nogil=True)
def candidate_recall_grid(full, ham, n_bits, truth, qself, ms, ws, keeps):
    """Hits and re-ranked rows of every (M', W', Hamming cut) of a grid at once (calibration).

    ``full`` (Q, M, 2 W): the window candidates of the largest M and W; ``ham``: their Hamming
    distances (`candidate_hamming`).  The candidates of (M', W') are
    ``full[:, :M', W - W': W + W']`` in list-major order, as `PermutationIndex.candidates`
    returns them.  The cut is `collect_candidates`'s (the smallest Hamming distances, ties in
    discovery order), without sorting: a candidate's place in that order is the number of
    distinct candidates at a smaller distance plus those at its distance discovered before it,
    from a histogram over the ``n_bits + 1`` distances; only the true neighbours' and the
    query's own row's places are needed.  The lists are nested, so one pass over the largest
    M' of each W' serves every M' (O(M'·W' + |ms|·b) per query and W', not a sort per point).

    For each query and grid point: its distinct candidates (-1 ignored), cut to the first
    ``keeps[j]`` (0: all), which of ``truth[q]`` (true neighbours in rank order, -1 padded)
    are among them and how many are not the query's own row ``qself[q]``.

    Returns hits: int64 (len(ms), len(ws), len(keeps), truth.shape[1]), the hits of each true
    neighbour rank summed over queries (their sum over the last axis is recall@k's numerator;
    by rank, a merged answer over several segments is predicted, see
    `lshdist.index.calibrate.merged_relevance`), and reranked: int64 (len(ms), len(ws),
    len(keeps)), summed over queries.
    """
    Q, M, T = full.shape
    w_max = T // 2
    nm, nw, nk = ms.shape[0], ws.shape[0], keeps.shape[0]
    kt = truth.shape[1]
    N = 0
    for q in range(Q):
        for m in range(M):
            for t in range(T):
                if full[q, m, t] + 1 > N:
                    N = full[q, m, t] + 1
    # bitmaps, one bit a row: the rows seen in this (query, window) pass, and the query's true
    # neighbours and own row.  Both are read at random rows for every entry; at N/8 bytes
    # (7.5 KB for 60,000 rows) they stay in L1, where int32 arrays per row (720 KB) did not
    # stay even in L2 (paired: 1.07x on 100 Fashion-MNIST queries, 1.38x with the rows' ids
    # spread over 1 M)
    n_words = (max(N, 1) + 63) >> 6
    seen = np.zeros(n_words, dtype=np.uint64)
    special = np.zeros(n_words, dtype=np.uint64)
    one = np.uint64(1)
    # per Hamming distance, the distinct candidates seen so far: a candidate's place in the
    # cut order is (candidates at a smaller distance) + (those at its distance seen before it)
    hist = np.zeros(n_bits + 1, dtype=np.int64)
    cum = np.zeros(n_bits + 1, dtype=np.int64)
    rec_h = np.empty(kt + 1, dtype=np.int64)  # the true neighbours found (and the query's row)
    rec_tie = np.empty(kt + 1, dtype=np.int64)
    rec_rank = np.empty(kt + 1, dtype=np.int64)  # -1: the query's own row
    rec_pos = np.empty(kt + 1, dtype=np.int64)
    hits = np.zeros((nm, nw, nk, kt), dtype=np.int64)
    reranked = np.zeros((nm, nw, nk), dtype=np.int64)
    m_last = ms[nm - 1]
    for q in range(Q):
        qs = qself[q]
        for t in range(kt):
            v = truth[q, t]
            if 0 <= v < N:
                special[v >> 6] |= one << np.uint64(v & 63)
        if 0 <= qs < N:
            special[qs >> 6] |= one << np.uint64(qs & 63)
        for b in range(nw):
            w = ws[b]
            hist[:] = 0
            n = 0
            nrec = 0
            a = 0
            while a < nm and ms[a] <= 0:  # M' = 0: no candidates (left at zero)
                a += 1
            # the lists are nested: (M', W) holds (M'', W)'s candidates for M'' < M', in the
            # same discovery order, then its own -- one pass over the largest M' serves all
            for m in range(m_last):
                for t in range(w_max - w, w_max + w):
                    v = full[q, m, t]
                    if v < 0:
                        continue
                    word = v >> 6
                    bit = one << np.uint64(v & 63)
                    if seen[word] & bit:
                        continue
                    seen[word] |= bit
                    h = ham[q, m, t]
                    if special[word] & bit:
                        # its first rank among the true neighbours (-1: none), and whether it
                        # is the query's own row (both: counted as each)
                        r = -1
                        for t2 in range(kt):
                            if truth[q, t2] == v:
                                r = t2
                                break
                        if r >= 0:
                            rec_h[nrec] = h
                            rec_tie[nrec] = hist[h]
                            rec_rank[nrec] = r
                            nrec += 1
                        if v == qs:
                            rec_h[nrec] = h
                            rec_tie[nrec] = hist[h]
                            rec_rank[nrec] = -1
                            nrec += 1
                    hist[h] += 1
                    n += 1
                while a < nm and ms[a] == m + 1:
                    # each recorded row's place in the cut order: one prefix sum of the
                    # histogram up to the largest distance recorded
                    top = -1
                    for r in range(nrec):
                        top = max(top, rec_h[r])
                    less = 0
                    for h in range(top + 1):
                        cum[h] = less
                        less += hist[h]
                    for r in range(nrec):
                        rec_pos[r] = cum[rec_h[r]] + rec_tie[r]
                    for j in range(nk):
                        lim = n if keeps[j] <= 0 or keeps[j] > n else keeps[j]
                        s = 0
                        for r in range(nrec):
                            if rec_pos[r] < lim:
                                if rec_rank[r] >= 0:
                                    hits[a, b, j, rec_rank[r]] += 1
                                else:
                                    s += 1
                        reranked[a, b, j] += lim - s
                    a += 1
            # clear the pass's bits: by its entries when they are fewer than the words
            if m_last * 2 * w < n_words:
                for m in range(m_last):
                    for t in range(w_max - w, w_max + w):
                        v = full[q, m, t]
                        if v >= 0:
                            seen[v >> 6] = np.uint64(0)
            else:
                seen[:] = 0
        for t in range(kt):
            v = truth[q, t]
            if 0 <= v < N:
                special[v >> 6] = np.uint64(0)
        if 0 <= qs < N:
            special[qs >> 6] = np.uint64(0)
    return hits, reranked
