"""`PermutationIndex`: Charikar's permutation-sorted key lists for one segment."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lshdist._kernels.hashing import permuted_prefix
from lshdist._kernels.search import (
    collect_candidates,
    window_candidates_bsearch,
    window_candidates_merge,
)
from lshdist.errors import InputError, NotFittedError
from lshdist.index.params import resolve_permutations
from lshdist.validation import check_k


def check_codes(codes: np.ndarray, bits: int, *, name: str = "codes") -> np.ndarray:
    codes = np.asarray(codes)
    if codes.dtype != np.uint64 or codes.ndim != 2:
        raise InputError(f"{name} must be a 2-d uint64 array of packed keys, got {codes.dtype} {codes.shape}")
    if codes.shape[1] != (bits + 63) // 64:
        raise InputError(
            f"{name} have {codes.shape[1]} words per key, but {bits} bits need {(bits + 63) // 64}"
        )
    return np.ascontiguousarray(codes)


def permutation_prefixes(codes: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """uint64 (M, n): the 64-bit permuted prefix of every key under every permutation."""
    out = np.empty((positions.shape[0], codes.shape[0]), dtype=np.uint64)
    for m in range(positions.shape[0]):
        out[m] = permuted_prefix(codes, positions[m])
    return out


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    b = np.linspace(0, n, max(1, parts) + 1).astype(int)
    return [(int(b[i]), int(b[i + 1])) for i in range(len(b) - 1) if b[i + 1] > b[i]]


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

    def fit(self, codes: np.ndarray, bits: int, payload, ids: np.ndarray | None = None, *,
            n_threads: int = 1):
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
        rng = np.random.default_rng(self.seed)
        L = min(64, bits)
        positions = np.stack([rng.permutation(bits)[:L] for _ in range(M)]).astype(np.int64)
        sorted_prefix = np.empty((M, N), dtype=np.uint64)
        # row numbers fit int32 for any segment below 2**31 rows: half the memory and disk
        sorted_rows = np.empty((M, N), dtype=np.int32 if N < 2**31 else np.int64)

        def build(part):
            lo, hi = part
            prefixes = permutation_prefixes(codes, positions[lo:hi])
            order = np.argsort(prefixes, axis=1, kind="stable")
            sorted_prefix[lo:hi] = np.take_along_axis(prefixes, order, 1)
            sorted_rows[lo:hi] = order

        parts = _split(M, n_threads)
        if len(parts) > 1:  # the kernel and numpy's sort release the GIL
            with ThreadPoolExecutor(len(parts)) as pool:
                list(pool.map(build, parts))
        else:
            build((0, M))
        self._set_state(
            bits=bits, codes=codes, positions=positions,
            sorted_prefix=sorted_prefix, sorted_rows=sorted_rows,
            payload=payload,
            ids=np.arange(N, dtype=np.int64) if ids is None else np.asarray(ids, np.int64),
        )
        return self

    def _set_state(self, *, bits, codes, positions, sorted_prefix, sorted_rows, payload, ids):
        self.bits_ = int(bits)
        self.codes_ = codes
        self.positions_ = positions
        self.sorted_prefix_ = sorted_prefix
        self.sorted_rows_ = sorted_rows
        self.payload_ = payload
        self.ids_ = ids
        self.n_permutations_ = positions.shape[0]

    @classmethod
    def from_state(cls, *, window, hamming_keep, seed, **state) -> "PermutationIndex":
        """Rebuild a fitted index from stored arrays (see `lshdist.store.index`)."""
        idx = cls(n_permutations=state["positions"].shape[0], window=window,
                  hamming_keep=hamming_keep, seed=seed)
        idx._set_state(**state)
        return idx

    def __len__(self) -> int:
        return self._fitted().codes_.shape[0]

    def _fitted(self):
        if not hasattr(self, "codes_"):
            raise NotFittedError("this PermutationIndex is not fitted; call fit(codes, bits, payload)")
        return self

    def candidates(self, qcodes: np.ndarray, *, bulk: bool = True) -> np.ndarray:
        """Raw window candidates, int64 (Q, 2 M W) rows, -1 past a list's ends.

        ``bulk`` uses the sort-merge join; otherwise one binary search per query and list.
        Both return the same array.
        """
        self._fitted()
        qcodes = check_codes(qcodes, self.bits_, name="query codes")
        qprefix = permutation_prefixes(qcodes, self.positions_)
        W = int(self.window)
        if bulk:
            qorder = np.argsort(qprefix, axis=1, kind="stable").astype(np.int64)
            return window_candidates_merge(self.sorted_prefix_, self.sorted_rows_, qprefix, qorder, W)
        return window_candidates_bsearch(self.sorted_prefix_, self.sorted_rows_, qprefix, W)

    def search(self, qcodes: np.ndarray, qpayload, k: int, *, bulk: bool = True,
               n_threads: int = 1):
        """Top-k by the exact learned distance among the candidates.

        Returns
        -------
        distances : float32 (Q, k), ascending (inf where fewer than k candidates)
        ids : int64 (Q, k) (-1 where fewer than k candidates)
        stats : dict with int64 (Q,) arrays ``distinct`` (distinct candidates) and
            ``reranked`` (candidates whose exact distance was computed)
        """
        k = check_k(k)
        self._fitted()
        Q = qcodes.shape[0]
        parts = _split(Q, n_threads)
        if len(parts) <= 1:
            results = [self._search_part(qcodes, qpayload, k, bulk, 0, Q)]
        else:
            with ThreadPoolExecutor(len(parts)) as pool:
                results = list(pool.map(
                    lambda p: self._search_part(qcodes, qpayload, k, bulk, *p), parts))
        dist = np.concatenate([r[0] for r in results])
        rows = np.concatenate([r[1] for r in results])
        ids = np.where(rows >= 0, self.ids_[np.maximum(rows, 0)], -1)
        stats = {"distinct": np.concatenate([r[2] for r in results]),
                 "reranked": np.concatenate([r[3] for r in results])}
        return dist, ids, stats

    def _search_part(self, qcodes, qpayload, k, bulk, lo, hi):
        qc = qcodes[lo:hi]
        cand = self.candidates(qc, bulk=bulk)
        offsets, rows, distinct = collect_candidates(cand, self.codes_, qc, int(self.hamming_keep))
        qp = qpayload.take(slice(lo, hi)) if (lo, hi) != (0, len(qpayload)) else qpayload
        dist, top = self.payload_.rerank(offsets, rows, qp, k, self.ids_)
        return dist, top, distinct, np.diff(offsets)
