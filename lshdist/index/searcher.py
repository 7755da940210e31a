"""`MetricIndex`: a learned metric, its hash family and a `PermutationIndex`, in one process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lshdist.blocks import RowsLike, as_block
from lshdist.errors import InputError, NotFittedError
from lshdist.hashing.families import LearnedImplicit, family_for
from lshdist.index.payload import make_payload
from lshdist.index.permutation import PermutationIndex
from lshdist.index.scan import scan_topk
from lshdist.metric.learned import ImplicitMetric

if TYPE_CHECKING:
    from lshdist.hashing.families import HashFamily
    from lshdist.protocols import Metric, RerankPayload

MODES = ("hash", "scan")


def encode(metric: Metric, family: HashFamily, X: RowsLike, *, query: bool = False
           ) -> tuple[np.ndarray, RerankPayload]:
    """Keys and re-rank payload of rows ``X``; kernel values are computed once for both."""
    B = metric.check(as_block(X))
    kx = None
    if isinstance(metric, ImplicitMetric) and not metric.is_identity:
        kx = metric.kernel_values(B)
    if isinstance(family, LearnedImplicit):
        codes = family.hash_with(B, kx)
    else:
        codes = family.hash(B)
    payload: RerankPayload = make_payload(metric, B, query=query, kx=kx)
    return codes, payload


def answer(index: PermutationIndex, qcodes: np.ndarray, qpayload: RerankPayload, k: int, *,
           mode: str,
           bulk: bool = True, n_threads: int = 1
           ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Top-k of encoded queries against one fitted `PermutationIndex`, hashed or by exact scan:
    ``(dist (Q, k), ids (Q, k), stats)``; ``stats["reranked"]`` (Q,) counts the exact
    distances computed per query.  The one place the modes are dispatched."""
    if mode == "scan":
        dist, ids = scan_topk(index.payload_, qpayload, k, ids=index.ids_, n_threads=n_threads)
        return dist, ids, {"reranked": np.full(len(ids), len(index), np.int64)}
    if mode != "hash":
        raise InputError(f"mode={mode!r}; choose one of {list(MODES)}")
    found: tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] = index.search(
        qcodes, qpayload, k, bulk=bulk, n_threads=n_threads)
    return found


def permutation_seed(seed: int) -> int:
    """The permutations' seed, distinct from the hash coefficients' seed."""
    return int(np.random.SeedSequence([int(seed), 1]).generate_state(1)[0])


class MetricIndex:
    """Hash-and-search (or scan) under a metric; scikit-learn-shaped ``fit`` / ``query``.

    Parameters
    ----------
    metric : `ExplicitMetric` or `ImplicitMetric` (identity ones give the L2 baselines)
    bits : b, key length
    n_permutations, epsilon, window, hamming_keep : see `PermutationIndex`
    learned : learned hash functions (True) or Charikar's baseline (False)
    seed : seeds the hash coefficients and the permutations
    """

    def __init__(self, metric: Metric, *, bits: int = 256, n_permutations: int | None = None,
                 epsilon: float | None = None, window: int = 1, hamming_keep: int = 0,
                 learned: bool = True, seed: int = 0) -> None:
        self.metric = metric
        self.bits = bits
        self.n_permutations = n_permutations
        self.epsilon = epsilon
        self.window = window
        self.hamming_keep = hamming_keep
        self.learned = learned
        self.seed = seed

    def fit(self, X: RowsLike, ids: np.ndarray | None = None, *, n_threads: int = 1
            ) -> MetricIndex:
        self.family_ = family_for(self.metric, bits=self.bits, seed=self.seed,
                                  learned=self.learned)
        codes, payload = encode(self.metric, self.family_, X)
        self.index_ = PermutationIndex(
            n_permutations=self.n_permutations, epsilon=self.epsilon, window=self.window,
            hamming_keep=self.hamming_keep, seed=permutation_seed(self.seed),
        ).fit(codes, self.family_.bits, payload, ids, n_threads=n_threads)
        return self

    def query(self, Xq: RowsLike, k: int, *, mode: str = "hash", bulk: bool = True,
              n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(distances, ids)``, each (Q, k), ascending.  ``self.stats_`` holds per-query
        candidate counts of the last hashed query."""
        if not hasattr(self, "index_"):
            raise NotFittedError("this MetricIndex is not fitted; call fit(X) first")
        if mode not in MODES:
            raise InputError(f"mode={mode!r}; choose one of {list(MODES)}")
        qcodes, qpayload = encode(self.metric, self.family_, Xq, query=True)
        dist, ids, stats = answer(self.index_, qcodes, qpayload, k, mode=mode, bulk=bulk,
                                  n_threads=n_threads)
        if mode == "hash":
            self.stats_ = stats
        return dist, ids
