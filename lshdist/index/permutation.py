"""`PermutationIndex`: Charikar's permutation-sorted key lists for one segment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from lshdist._kernels.hashing import permuted_prefix
from lshdist._kernels.search import (
    collect_windows,
    window_candidates,
    window_positions_bsearch,
    window_positions_merge,
)
from lshdist._kernels.sort import radix_argsort_u64, radix_sort_u64
from lshdist.blocks import on_row_ranges, row_ranges
from lshdist.errors import InputError, NotFittedError
from lshdist.index.params import resolve_permutations
from lshdist.limits import available_memory
from lshdist.validation import check_k

if TYPE_CHECKING:
    from lshdist.protocols import RerankPayload


def check_codes(codes: np.ndarray, bits: int, *, name: str = "codes") -> np.ndarray:
    codes = np.asarray(codes)
    if codes.dtype != np.uint64 or codes.ndim != 2:
        raise InputError(f"{name} must be a 2-d uint64 array of packed keys, got {codes.dtype} "
                         f"{codes.shape}")
    if codes.shape[1] != (bits + 63) // 64:
        raise InputError(
            f"{name} have {codes.shape[1]} words per key, but {bits} bits need {(bits + 63) // 64}"
        )
    return np.ascontiguousarray(codes)


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_state(*, window: int, hamming_keep: int, bits: int, codes: np.ndarray,
                positions: np.ndarray, sorted_prefix: np.ndarray | None,
                sorted_rows: np.ndarray, payload: RerankPayload, ids: np.ndarray) -> None:
    """Check that stored arrays form a fitted state the search kernels can read safely.

    Vectorised range checks, O(M N) once per load: ``codes`` uint64 (N, ceil(b/64));
    ``positions`` int64 (M, min(64, b)), distinct bit numbers in [0, b) per row;
    ``sorted_rows`` int32/int64 (M, N), every row a permutation of 0..N-1; ``sorted_prefix``
    uint64 (M, N), ascending per row (None: not stored, see `list_prefixes`); ``ids`` int64
    (N,); ``len(payload) == N``.

    Raises
    ------
    InputError
        Naming the first array that is not what the kernels expect.
    """
    if not _is_int(bits) or bits < 1:
        raise InputError(f"bits={bits!r}: the key length must be an integer >= 1")
    if not _is_int(window) or window < 1:
        raise InputError(f"window={window!r}: W must be an integer >= 1")
    if not _is_int(hamming_keep) or hamming_keep < 0:
        raise InputError(f"hamming_keep={hamming_keep!r}: must be an integer >= 0")
    codes = check_codes(codes, int(bits))
    N = codes.shape[0]
    if N == 0:
        raise InputError("codes have 0 rows: a stored segment holds at least one row")
    L = min(64, int(bits))
    positions = np.asarray(positions)
    if positions.dtype != np.int64 or positions.ndim != 2 or positions.shape[1] != L:
        raise InputError(f"positions must be int64 (M, {L}) for b={bits}, got "
                         f"{positions.dtype} {positions.shape}")
    M = positions.shape[0]
    if M == 0:
        raise InputError("positions has 0 rows: at least one permutation is needed")
    if positions.min() < 0 or positions.max() >= bits:
        raise InputError(f"positions hold bit numbers in [{positions.min()}, {positions.max()}], "
                         f"outside [0, {bits})")
    if L > 1 and not np.all(np.diff(np.sort(positions, axis=1), axis=1) > 0):
        raise InputError("positions repeat a bit within a permutation")
    sorted_rows = np.asarray(sorted_rows)
    if sorted_rows.dtype not in (np.int32, np.int64) or sorted_rows.shape != (M, N):
        raise InputError(f"sorted_rows must be int32 or int64 (M, N) = ({M}, {N}), got "
                         f"{sorted_rows.dtype} {sorted_rows.shape}")
    lo, hi = int(sorted_rows.min()), int(sorted_rows.max())
    if lo < 0 or hi >= N:
        raise InputError(f"sorted_rows hold rows in [{lo}, {hi}], outside [0, {N})")
    seen = np.empty(N, dtype=bool)
    for m in range(M):  # in range and N entries: a permutation iff every row is hit
        seen[:] = False
        seen[sorted_rows[m]] = True
        if not seen.all():
            raise InputError(f"sorted_rows[{m}] is not a permutation of 0..{N - 1} "
                             f"({N - int(seen.sum())} rows missing)")
    if sorted_prefix is not None:
        sorted_prefix = np.asarray(sorted_prefix)
        if sorted_prefix.dtype != np.uint64 or sorted_prefix.shape != (M, N):
            raise InputError(f"sorted_prefix must be uint64 (M, N) = ({M}, {N}), got "
                             f"{sorted_prefix.dtype} {sorted_prefix.shape}")
        _check_ascending(sorted_prefix, "sorted_prefix is not ascending within every "
                                        "permutation")
    ids = np.asarray(ids)
    if ids.dtype != np.int64 or ids.shape != (N,):
        raise InputError(f"ids must be int64 ({N},), got {ids.dtype} {ids.shape}")
    if len(payload) != N:
        raise InputError(f"the payload has {len(payload)} rows, the codes {N}")


def _check_ascending(sorted_prefix: np.ndarray, message: str) -> None:
    if sorted_prefix.shape[1] > 1 and not np.all(sorted_prefix[:, 1:] >= sorted_prefix[:, :-1]):
        raise InputError(message)


def list_prefixes(codes: np.ndarray, positions: np.ndarray, sorted_rows: np.ndarray
                  ) -> np.ndarray:
    """uint64 (M, N): each list's permuted prefixes in list order — what `fit` sorts by,
    recomputed from the keys (``sorted_prefix[m] = prefix_m(codes)[sorted_rows[m]]``).  A stored
    segment keeps only ``sorted_rows``: the prefixes are 8 bytes per row and list, 43 % of a
    784-d segment on disk, and take about as long to recompute as to read and verify."""
    out = np.empty(sorted_rows.shape, dtype=np.uint64)
    for m in range(positions.shape[0]):
        out[m] = permuted_prefix(codes, positions[m])[sorted_rows[m]]
    return out


def permutation_prefixes(codes: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """uint64 (M, n): the 64-bit permuted prefix of every key under every permutation."""
    out = np.empty((positions.shape[0], codes.shape[0]), dtype=np.uint64)
    for m in range(positions.shape[0]):
        out[m] = permuted_prefix(codes, positions[m])
    return out


#: queries searched at once per thread, at most: each block walks every list once (the
#: sort-merge join), so a larger block reads the lists for more queries at a time — on a
#: 100,000-row segment of the 1 M set, 10,000 queries at M=96 W=16 H=120: 59.9 us a query
#: in blocks of 4,096, 53.7 us in one block of 16,384
QUERY_BLOCK = 16384
#: bytes of window positions (int64, M a query) a join block may hold (`query_block`)
BLOCK_BYTES = 64 << 20
#: lists whose permuted query prefixes are made and sorted at a time for the join (its
#: scratch: 16 bytes a query and list)
LIST_GROUP = 16
#: queries whose candidates are collected and re-ranked at a time within a join block: the
#: join needs the whole block, the candidates only their own queries — so a block's memory is
#: its window positions and one sub-block's candidates, not every query's (a 10,000-query
#: chunk at M=128 W=16 H=480 with k=100: the search's traced peak 122 -> 51 MiB, 27 of them
#: the result and the segment's uint8 copy; measured)
SUB_BLOCK = 1024
#: bytes of candidate rows (int64) a sub-block may hold (`sub_block`)
SUB_BYTES = 8 << 20


def query_block(n_lists: int) -> int:
    """Queries per join block of a search with ``n_lists`` lists: `QUERY_BLOCK`, fewer where
    the block's window positions (int64, one per list) would pass `BLOCK_BYTES` — at least
    256.  (The block's candidates are bounded by `sub_block`.)"""
    return int(max(256, min(QUERY_BLOCK, BLOCK_BYTES // (8 * max(n_lists, 1)))))


def sub_block(n_lists: int, window: int, hamming_keep: int, n_rows: int) -> int:
    """Queries whose candidates are collected and re-ranked at once at (M, W, H) on
    ``n_rows`` rows: `SUB_BLOCK`, fewer where their candidate rows (int64; H per query, or
    every distinct window entry when H = 0) would pass `SUB_BYTES` — at least 1 (one query
    wider than `SUB_BYTES` alone)."""
    width = min(2 * n_lists * window, max(n_rows, 1))
    if hamming_keep > 0:
        width = min(width, hamming_keep)
    return int(max(1, min(SUB_BLOCK, SUB_BYTES // (8 * max(width, 1)))))


def draw_positions(rng: np.random.Generator, bits: int, M: int) -> np.ndarray:
    """The key bits of M permuted prefixes, int64 (M, min(64, bits)): 64 distinct key bits
    each, in random order.

    Every key bit is an independent random hyperplane, so which 64 bits a prefix takes need
    not be a uniformly random subset.  For b a multiple of 8 (b >= 64) the lists come in
    blocks of b/64: a random permutation of the key's bytes is cut into groups of 8 bytes, one
    group per list, and each list's 64 bits are put in random order.  A prefix then reads 8
    key bytes -- 8 table lookups per row in `permuted_prefix` instead of about 42 for 64
    random bits of a 512-bit key -- and the lists of a block share no bit.  Measured against
    64 random bits (same grid, 5 seeds; `benchmarks/bench_positions.py`): the same recall
    within the seeds' spread on Fashion-MNIST, Letter and 20 Newsgroups.  The random order
    within the prefix matters: whole bytes with their bits kept together (a list's leading 8
    bits one key byte, so lists sharing a leading byte agree on their first 8 bits) cut
    20 Newsgroups' recall from 0.72 to 0.60.  Other b: 64 random bits."""
    L = min(64, bits)
    nbytes = bits // 8
    if bits % 8 or bits < 64:
        return np.stack([rng.permutation(bits)[:L] for _ in range(M)]).astype(np.int64)
    rows: list[np.ndarray] = []
    while len(rows) < M:
        order = rng.permutation(nbytes)
        for g in range(min(nbytes // 8, M - len(rows))):
            group = order[8 * g:8 * g + 8]
            row = (8 * group[:, None] + np.arange(8)[None, :]).ravel()
            rows.append(row[rng.permutation(64)])
    return np.stack(rows).astype(np.int64)


#: bytes a row a build thread needs besides the lists: the permuted prefixes, their sort
#: order and the radix sort's buffers (8 bytes each), and the sorted prefixes' temporary
BUILD_BYTES_PER_ROW = 40


def check_list_memory(M: int, N: int, n_threads: int = 1) -> None:
    """Refuse M permutation lists of N rows (the uint64 prefixes and the rows: 12 bytes a row
    a list, 16 from 2**31 rows) that would not fit, with each build thread's temporaries, in
    the memory available (`available_memory`): the default M = 2 sqrt(N) of 1,020,000 rows
    asks for 24.7 GB, and a process that allocates it is killed by the system without a word.

    Raises
    ------
    InputError
        If the lists need more bytes than are available."""
    per_list = (8 + (4 if N < 2**31 else 8)) * int(N)
    need = int(M) * per_list + max(1, int(n_threads)) * BUILD_BYTES_PER_ROW * int(N)
    free = available_memory()
    if free is None or need <= free:
        return
    fits = (free - max(1, int(n_threads)) * BUILD_BYTES_PER_ROW * int(N)) // per_list
    how = (f"give fewer lists (n_permutations / --permutations; {fits:,} fit) or fewer rows "
           "per segment" if fits >= 1 else "give fewer rows per segment: not one list fits")
    raise InputError(f"the {M:,} permutation lists of {N:,} rows need {need / 2**30:.1f} GiB "
                     f"with the build's temporaries, more than the {free / 2**30:.1f} GiB of "
                     f"memory available: {how}")


class PermutationIndex:
    """M random permutations of the key bits; per permutation the rows sorted by permuted key.

    Parameters
    ----------
    n_permutations : M, set directly; or
    epsilon : M = ceil(2 N^{1/(1+eps)})
    window : W, entries taken on each side of a query's position in each list
    hamming_keep : if > 0, of each query's distinct candidates keep the ``hamming_keep`` nearest
        in Hamming distance of the full b-bit keys before the exact re-rank (0: re-rank all)
    seed : seeds the permutations

    Notes
    -----
    Each list is sorted by the first 64 bits of the permuted key (ties by row), the prefix kept
    for the search; for b <= 64 this is the whole key.
    """

    def __init__(self, *, n_permutations: int | None = None, epsilon: float | None = None,
                 window: int = 1, hamming_keep: int = 0, seed: int = 0):
        self.n_permutations = n_permutations
        self.epsilon = epsilon
        self.window = window
        self.hamming_keep = hamming_keep
        self.seed = seed

    def fit(self, codes: np.ndarray, bits: int, payload: RerankPayload,
            ids: np.ndarray | None = None, *, n_threads: int = 1) -> PermutationIndex:
        """Build the lists from packed keys (N, words) and the re-rank payload
        (``n_threads`` threads over the permutations)."""
        codes = check_codes(codes, bits)
        N = codes.shape[0]
        if N == 0:
            raise InputError("cannot index an empty segment (0 rows)")
        if len(payload) != N:
            raise InputError(f"payload has {len(payload)} rows, codes have {N}")
        if self.window < 1:
            raise InputError(f"window={self.window}: W must be >= 1")
        if self.hamming_keep < 0:
            raise InputError(f"hamming_keep={self.hamming_keep}: must be >= 0")
        M = resolve_permutations(N, epsilon=self.epsilon, permutations=self.n_permutations)
        check_list_memory(M, N, len(row_ranges(M, n_threads)))
        rng = np.random.default_rng(self.seed)
        positions = draw_positions(rng, bits, M)
        sorted_prefix = np.empty((M, N), dtype=np.uint64)
        # row numbers fit int32 for any segment below 2**31 rows: half the memory and disk
        sorted_rows = np.empty((M, N), dtype=np.int32 if N < 2**31 else np.int64)

        rows = np.arange(N, dtype=sorted_rows.dtype)

        def build(lo: int, hi: int) -> None:
            for m in range(lo, hi):  # the kernels release the GIL: threads share the lists
                # stable: ties by row, as np.argsort's
                sorted_prefix[m], sorted_rows[m] = radix_sort_u64(
                    permuted_prefix(codes, positions[m]), rows)

        on_row_ranges(build, M, n_threads)  # the kernel and numpy's sort release the GIL
        self._set_state(
            bits=bits, codes=codes, positions=positions,
            sorted_prefix=sorted_prefix, sorted_rows=sorted_rows,
            payload=payload,
            ids=np.arange(N, dtype=np.int64) if ids is None else np.asarray(ids, np.int64),
        )
        return self

    def _set_state(self, *, bits: int, codes: np.ndarray, positions: np.ndarray,
                   sorted_prefix: np.ndarray, sorted_rows: np.ndarray, payload: RerankPayload,
                   ids: np.ndarray) -> None:
        self.bits_ = int(bits)
        self.codes_ = codes
        self.positions_ = positions
        self.sorted_prefix_ = sorted_prefix
        self.sorted_rows_ = sorted_rows
        self.payload_ = payload
        self.ids_ = ids
        self.n_permutations_ = int(positions.shape[0])

    @classmethod
    def from_state(cls, *, window: int, hamming_keep: int, seed: int, bits: int,
                   codes: np.ndarray, positions: np.ndarray, sorted_rows: np.ndarray,
                   payload: RerankPayload, ids: np.ndarray,
                   sorted_prefix: np.ndarray | None = None) -> PermutationIndex:
        """Rebuild a fitted index from stored arrays (see `lshdist.store.index`).

        Every shape, dtype and range the kernels rely on is checked first (`check_state`), so
        that no kernel reads outside an array whatever was on disk.  Without ``sorted_prefix``
        (segments written since it is no longer stored) the prefixes are recomputed from the
        keys (`list_prefixes`) and must come out ascending in every list: keys, bit positions
        and list order that do not belong together are refused.

        Raises
        ------
        InputError
            If the arrays are not a consistent fitted state.
        """
        check_state(window=window, hamming_keep=hamming_keep, bits=bits, codes=codes,
                    positions=positions, sorted_prefix=sorted_prefix, sorted_rows=sorted_rows,
                    payload=payload, ids=ids)
        if sorted_prefix is None:
            codes = np.ascontiguousarray(codes)
            sorted_prefix = list_prefixes(codes, np.ascontiguousarray(positions),
                                          np.ascontiguousarray(sorted_rows))
            _check_ascending(sorted_prefix, "the keys, bit positions and list order do not "
                                            "belong together (the recomputed prefixes are not "
                                            "ascending within every list)")
        idx = cls(n_permutations=int(positions.shape[0]), window=int(window),
                  hamming_keep=int(hamming_keep), seed=seed)
        idx._set_state(bits=bits, codes=np.ascontiguousarray(codes),
                       positions=np.ascontiguousarray(positions),
                       sorted_prefix=np.ascontiguousarray(sorted_prefix),
                       sorted_rows=np.ascontiguousarray(sorted_rows), payload=payload,
                       ids=np.ascontiguousarray(ids))
        return idx

    def __len__(self) -> int:
        return int(self._fitted().codes_.shape[0])

    def _fitted(self) -> PermutationIndex:
        if not hasattr(self, "codes_"):
            raise NotFittedError(
                "this PermutationIndex is not fitted; call fit(codes, bits, payload)")
        return self

    def candidates(self, qcodes: np.ndarray, *, bulk: bool = True,
                   n_permutations: int | None = None, window: int | None = None) -> np.ndarray:
        """Raw window candidates (Q, 2 M W) rows (int32 below 2**31 rows, else int64), -1 past
        a list's ends: per list, the W entries left of the query's position, then the W from
        it on (`window_positions`; the search reads the same entries in place).  ``window``
        overrides the fitted W for this call.
        """
        pos, M = self.window_positions(qcodes, bulk=bulk, n_permutations=n_permutations)
        cand: np.ndarray = window_candidates(pos, self.sorted_rows_[:M], self._window(window))
        return cand

    def window_positions(self, qcodes: np.ndarray, *, bulk: bool = True,
                         n_permutations: int | None = None) -> tuple[np.ndarray, int]:
        """Each query's place in each of the first M lists, int64 (Q, M), and M.

        ``bulk`` uses the sort-merge join — unless the batch is so small that one binary search
        per query and list reads less (``8 Q log2 N < N``: a merge walks every list whole);
        ``bulk=False`` always searches.  Both return the same array.  ``n_permutations``
        (M' <= M: the first M' lists) overrides the fitted M for this call.
        """
        self._fitted()
        qcodes = check_codes(qcodes, self.bits_, name="query codes")
        M = self._lists(n_permutations)
        Q, n = qcodes.shape[0], self.sorted_prefix_.shape[1]
        merge = bulk and 8 * Q * max(1.0, np.log2(max(n, 2))) >= n
        pos = np.empty((Q, M), dtype=np.int64)
        for m0 in range(0, M, LIST_GROUP):  # the queries' prefixes a group of lists at a time
            m1 = min(M, m0 + LIST_GROUP)
            qprefix = permutation_prefixes(qcodes, self.positions_[m0:m1])
            sp = self.sorted_prefix_[m0:m1]
            if merge:
                qorder = np.stack([radix_argsort_u64(row) for row in qprefix])
                pos[:, m0:m1] = window_positions_merge(sp, qprefix, qorder)
            else:
                pos[:, m0:m1] = window_positions_bsearch(sp, qprefix)
        return pos, M

    def _window(self, window: int | None) -> int:
        W = int(self.window if window is None else window)
        if W < 1:
            raise InputError(f"window={W}: W must be >= 1")
        return W

    def _lists(self, n_permutations: int | None) -> int:
        M = self.n_permutations_
        if n_permutations is None:
            return M
        if not 1 <= n_permutations <= M:
            raise InputError(f"n_permutations={n_permutations}: this index has {M} lists; "
                             f"use 1..{M}")
        return int(n_permutations)

    def truncated(self, n_permutations: int) -> PermutationIndex:
        """The same index with only its first ``n_permutations`` lists (nested builds: the
        first M' lists of an M-list build are an M'-list build)."""
        M = self._lists(n_permutations)
        out = PermutationIndex(n_permutations=M, window=self.window,
                               hamming_keep=self.hamming_keep, seed=self.seed)
        out._set_state(bits=self.bits_, codes=self.codes_, positions=self.positions_[:M],
                       sorted_prefix=self.sorted_prefix_[:M], sorted_rows=self.sorted_rows_[:M],
                       payload=self.payload_, ids=self.ids_)
        return out

    def search(self, qcodes: np.ndarray, qpayload: RerankPayload, k: int, *, bulk: bool = True,
               n_threads: int = 1, n_permutations: int | None = None,
               window: int | None = None, hamming_keep: int | None = None
               ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Top-k by the exact learned distance among the candidates.

        Returns
        -------
        distances : float32 (Q, k), ascending (inf where fewer than k candidates)
        ids : int64 (Q, k) (-1 where fewer than k candidates)
        stats : dict with int64 (Q,) arrays ``distinct`` (distinct candidates) and
            ``reranked`` (candidates whose exact distance was computed)

        ``n_permutations``, ``window`` and ``hamming_keep`` override the fitted values for this
        call (an operating point chosen by calibration).
        """
        k = check_k(k)
        self._fitted()
        op = (self._lists(n_permutations), self.window if window is None else int(window),
              self.hamming_keep if hamming_keep is None else int(hamming_keep))
        if op[2] < 0:
            raise InputError(f"hamming_keep={op[2]}: must be >= 0")
        qcodes = check_codes(qcodes, self.bits_, name="query codes")  # also for no queries
        Q = qcodes.shape[0]
        # queries are answered in the order of their first permuted key: neighbouring queries
        # share candidates, whose rows are then still in cache (about 20 % of the re-rank on
        # Fashion-MNIST); every query's answer is independent of the order
        order = (radix_argsort_u64(permuted_prefix(qcodes, self.positions_[0]))
                 if Q > 1 else np.arange(Q))
        block = query_block(op[0])
        dist = np.empty((Q, k), dtype=np.float32)
        ids = np.empty((Q, k), dtype=np.int64)
        distinct = np.empty(Q, dtype=np.int64)
        reranked = np.empty(Q, dtype=np.int64)
        out = (dist, ids, distinct, reranked)

        def run(start: int, stop: int) -> None:
            # in join blocks, each answered in sub-blocks (`_search_part`); every query's
            # answer lands in its own rows of ``out`` (the threads' rows are disjoint)
            for lo in range(start, stop, block):
                sel = order[lo:min(lo + block, stop)]
                self._search_part(qcodes[sel], qpayload, sel, k, bulk, op, out)

        on_row_ranges(run, Q, n_threads)
        return dist, ids, {"distinct": distinct, "reranked": reranked}

    def _search_part(self, qc: np.ndarray, qpayload: RerankPayload, sel: np.ndarray, k: int,
                     bulk: bool, op: tuple[int, int, int],
                     out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Answer the queries ``sel`` (codes ``qc``) into rows ``sel`` of ``out`` = (dist,
        ids, distinct, reranked): one join for the block, then candidates collected and
        re-ranked `sub_block` queries at a time (the same answers: each query's are its own)."""
        M, W, H = op
        pos, M = self.window_positions(qc, bulk=bulk, n_permutations=M)
        step = sub_block(M, W, H, len(self.codes_))
        lists, window = self.sorted_rows_[:M], self._window(W)
        dist, ids, distinct, reranked = out
        for lo in range(0, len(sel), step):
            hi = min(lo + step, len(sel))
            offsets, rows, distinct[sel[lo:hi]] = collect_windows(
                pos[lo:hi], lists, window, self.codes_, qc[lo:hi], int(H))
            d, top = self.payload_.rerank(offsets, rows, qpayload.take(sel[lo:hi]), k,
                                          self.ids_)
            found = self.ids_[np.maximum(top, 0)]
            found[top < 0] = -1
            dist[sel[lo:hi]], ids[sel[lo:hi]] = d, found
            reranked[sel[lo:hi]] = np.diff(offsets)


def merge_topk(dists: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Global top-k from partial top-k lists (one per segment or part, each (Q, k_i)):
    ascending distance, ties by id, missing entries (id -1) last.  The top-k of a union is the
    top-k of its parts' top-k lists, so the result is the same however the rows were split."""
    dist = np.concatenate(list(dists), axis=1)
    idc = np.concatenate(list(ids), axis=1)
    missing = idc < 0
    dist = np.where(missing, np.inf, dist)
    order = np.lexsort((np.where(missing, np.iinfo(np.int64).max, idc), dist), axis=1)[:, :k]
    return (np.take_along_axis(dist, order, 1).astype(np.float32),
            np.take_along_axis(idc, order, 1))


class PackedSegment:
    """Segments packed into one by ``lshdist compact`` (the default, answer-preserving way):
    each part is the segment it was — its own lists, window, Hamming cut and re-rank — and the
    answers are merged by (distance, id), exactly as separate segments' answers are merged.
    A query therefore gets the same answer before and after the packing, with one segment to
    load and one task per query chunk instead of one per part."""

    def __init__(self, parts: Sequence[PermutationIndex]):
        if not parts:
            raise InputError("a packed segment needs at least one part")
        ms = {p.n_permutations_ for p in parts}
        if len(ms) != 1:
            raise InputError(f"the parts of a packed segment have {sorted(ms)} lists; pack only "
                             "segments with the same number of lists")
        self.parts = list(parts)
        self.n_permutations_ = parts[0].n_permutations_

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)
