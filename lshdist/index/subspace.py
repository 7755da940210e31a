"""`SubspaceIndex`: the spectral subspace-partition index (RSSH), in one process.

Partition (ARCHITECTURE.md section 2).  Rows are first mapped to the space the distance lives in
(``z = G x`` under an `ExplicitMetric`, ``z = x`` for L2) and centred on the database mean (the
subspaces pass through it; distances do not depend on it).  Round t: the rank-k subspace ``V_t``
of the remaining points by randomized block Krylov (`block_krylov`); the points within
``√2 (1+η) α_t`` of it form group t; repeat on the rest.  The last remaining points (fewer than
``min_group``, or all of them after ``max_rounds`` or after a round that captured nobody) form a
final group with its own rank-k subspace.

α: the paper's noise scale (a point lies within α of its subspace).  Given, it is used in every
round.  ``alpha=None`` estimates it per round as ``α_t = median_t / √2``, ``median_t`` the
median distance of the remaining points to ``V_t``: the threshold is then ``(1+η) median_t``,
each round captures at least half of what remains, and the rounds are at most
``ceil(log2(n / min_group)) + 1`` — the O(log n) of the paper by construction.  ``rounds_``
records every round's α, threshold and capture.

Codes (where the paper is vague).  Each group stores its points' projected coordinates
``y = V_gᵀ (z − c)`` (k numbers) and an r-bit code ``[R_g (y − μ_g) ≥ 0]``: the signs of r
Gaussian projections (R_g, r × k, seeded by the group number) of the projected coordinates
centred on the group's mean ``μ_g``.  Why this one: it is Charikar's family, which the rest of
lshdist uses, restricted to the subspace the group lives in (so its Hamming distance estimates
the angle around the group's centre, where the points are); it gives any r, also r > k (the
alternative, the signs of the top-r centred coordinates, stops at r = k and spends its bits on
the directions of largest variance only); and centring on μ_g splits the group in halves
instead of putting it all on one side of hyperplanes through the origin.

Query.  Route each query to the ``n_probe`` groups whose subspace is nearest (``‖z − V Vᵀ z‖``
around the centre; ties by group number), more while the probed groups hold fewer than k rows;
in each, code the query's projected coordinates, keep the ``n_candidates`` group members
nearest in Hamming distance (ties by id), and re-rank the union exactly by ``‖z − z_q‖²``
(the learned distance ``d_A`` under a metric) with ties by id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lshdist._kernels.hashing import pack_signs
from lshdist.errors import InputError, NotFittedError
from lshdist.index.krylov import block_krylov, subspace_residuals
from lshdist.index.payload import DensePayload
from lshdist.validation import check_finite, check_k, check_numeric_matrix

if TYPE_CHECKING:
    from lshdist.blocks import RowsLike
    from lshdist.metric.learned import ExplicitMetric

log = logging.getLogger(__name__)

#: Hamming-distance entries computed at once per group (queries x members), bounds memory
_HAMMING_BLOCK = 1 << 22


@dataclass(frozen=True)
class Round:
    """One round of the partition: ``remaining`` points before it, the α and threshold used,
    how many it ``captured`` (the group's size)."""

    round: int
    remaining: int
    alpha: float
    threshold: float
    captured: int


@dataclass(frozen=True)
class Group:
    """One group: database ``rows`` (sorted by id), ``basis`` V (d, k) float64, ``mean`` μ
    (k,) of the projected coordinates, ``coords`` float32 (n_g, k), ``codes`` uint64
    (n_g, ceil(r/64)), the code projections ``R`` (r, k); ``final`` for the leftover group."""

    rows: np.ndarray
    basis: np.ndarray
    mean: np.ndarray
    coords: np.ndarray
    codes: np.ndarray
    R: np.ndarray
    final: bool

    def encode(self, Zc: np.ndarray) -> np.ndarray:
        """r-bit codes of centred rows ``Zc`` (n, d): uint64 (n, ceil(r/64))."""
        Y = np.asarray(Zc, np.float64) @ self.basis
        return self.code(Y)

    def code(self, Y: np.ndarray) -> np.ndarray:
        out: np.ndarray = pack_signs(np.ascontiguousarray((Y - self.mean) @ self.R.T))
        return out


def _positive_int(name: str, v: object, lo: int = 1) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
        raise InputError(f"{name}={v!r}: must be an integer >= {lo}")
    return int(v)


class SubspaceIndex:
    """Spectral subspace-partition index; scikit-learn-shaped ``fit`` / ``query``.

    Parameters
    ----------
    rank : k, dimension of every group's subspace
    bits : r, code length per group
    eta : η >= 0, slack of the capture threshold ``√2 (1+η) α``
    alpha : α > 0, the noise scale; None: estimated per round (see the module notes)
    max_rounds : rounds of the partition at most (the leftover forms a final group)
    min_group : stop when fewer points remain (default ``max(2 rank, 64)``)
    krylov_iters : q of `block_krylov`
    n_probe : groups searched per query (nearest subspaces first)
    n_candidates : group members re-ranked per probed group (nearest in Hamming distance)
    metric : `ExplicitMetric` (partition and re-rank on ``G x``), or None for L2
    seed : seeds the Krylov starts and the code projections

    After ``fit``: ``groups_`` (`Group` list), ``rounds_`` (`Round` list), ``center_``,
    ``ids_``; after ``query``: ``stats_`` with int64 (Q,) ``reranked`` and ``probed``.
    """

    def __init__(self, *, rank: int = 16, bits: int = 32, eta: float = 0.1,
                 alpha: float | None = None, max_rounds: int = 32, min_group: int | None = None,
                 krylov_iters: int = 4, n_probe: int = 1, n_candidates: int = 100,
                 metric: ExplicitMetric | None = None, seed: int = 0) -> None:
        self.rank = rank
        self.bits = bits
        self.eta = eta
        self.alpha = alpha
        self.max_rounds = max_rounds
        self.min_group = min_group
        self.krylov_iters = krylov_iters
        self.n_probe = n_probe
        self.n_candidates = n_candidates
        self.metric = metric
        self.seed = seed

    def _space(self, X: RowsLike) -> np.ndarray:
        if self.metric is not None:  # the transform's rows, which also overflow to inf
            Z = self.metric.transform(X)
            check_finite(Z, name="X (in the model's space)")
            return Z
        return check_numeric_matrix(X)

    def check_params(self, d: int) -> int:
        """Check the parameters for data of d dimensions (as `fit` does); returns min_group."""
        k = _positive_int("rank", self.rank)
        if k > d:
            raise InputError(f"rank={k}: the subspaces cannot exceed the data's d={d} dimensions")
        _positive_int("bits", self.bits)
        _positive_int("max_rounds", self.max_rounds)
        _positive_int("krylov_iters", self.krylov_iters, lo=0)
        _positive_int("n_probe", self.n_probe)
        _positive_int("n_candidates", self.n_candidates)
        if not (isinstance(self.eta, (int, float)) and np.isfinite(self.eta) and self.eta >= 0):
            raise InputError(f"eta={self.eta!r}: must be a finite number >= 0")
        if self.alpha is not None and not (
                isinstance(self.alpha, (int, float)) and np.isfinite(self.alpha)
                and self.alpha > 0):
            raise InputError(f"alpha={self.alpha!r}: must be a finite number > 0, or None "
                             "(estimated per round)")
        if self.min_group is None:
            return max(2 * k, 64)
        return _positive_int("min_group", self.min_group)

    def fit(self, X: RowsLike, ids: np.ndarray | None = None) -> SubspaceIndex:
        """Partition the rows ``X`` (n, d) into groups.  ``ids`` int64 (n,), default 0..n-1."""
        Z = self._space(X)
        n, d = Z.shape
        min_group = self.check_params(d)
        k = int(self.rank)
        if ids is None:
            ids_ = np.arange(n, dtype=np.int64)
        else:
            ids_ = np.asarray(ids)
            if ids_.shape != (n,) or ids_.dtype.kind not in "iu":
                raise InputError(f"ids must be integers ({n},), got {ids_.dtype} {ids_.shape}")
            ids_ = ids_.astype(np.int64)
            if len(np.unique(ids_)) != n:
                raise InputError("ids repeat: every row needs its own id")
        center = Z.mean(axis=0, dtype=np.float64)
        Zc = (Z - center).astype(np.float32)
        scale = float(np.sqrt(2.0)) * (1.0 + float(self.eta))
        remaining = np.arange(n, dtype=np.int64)
        groups: list[Group] = []
        rounds: list[Round] = []
        for t in range(int(self.max_rounds)):
            if len(remaining) < min_group:
                break
            part = Zc[remaining]
            V = block_krylov(part, k, int(self.krylov_iters), seed=self._seed(0, t))
            res = subspace_residuals(part, V)
            alpha = (float(self.alpha) if self.alpha is not None
                     else float(np.median(res)) / float(np.sqrt(2.0)))
            threshold = scale * alpha
            inside = res <= threshold
            rounds.append(Round(t, len(remaining), alpha, threshold, int(inside.sum())))
            log.info("round %d: %d remaining, alpha %.4g, threshold %.4g, captured %d",
                     t, len(remaining), alpha, threshold, int(inside.sum()))
            if not inside.any():
                break
            groups.append(self._group(Zc, remaining[inside], V, ids_, len(groups), final=False))
            remaining = remaining[~inside]
        if len(remaining):
            V = block_krylov(Zc[remaining], k, int(self.krylov_iters),
                             seed=self._seed(0, len(rounds)))
            groups.append(self._group(Zc, remaining, V, ids_, len(groups), final=True))
        self.center_ = center
        self.ids_ = ids_
        self.payload_ = DensePayload(Z)
        self.groups_ = groups
        self.rounds_ = rounds
        self.bases_ = np.stack([g.basis for g in groups])  # (G, d, k)
        return self

    def _seed(self, stream: int, i: int) -> int:
        return group_seed(int(self.seed), stream, i)

    def _group(self, Zc: np.ndarray, rows: np.ndarray, V: np.ndarray, ids: np.ndarray,
               number: int, *, final: bool) -> Group:
        rows = rows[np.argsort(ids[rows], kind="stable")]  # members by id: Hamming ties by id
        return make_group(Zc[rows], rows, V, number=number, bits=int(self.bits),
                          seed=int(self.seed), final=final)

    @property
    def group_sizes_(self) -> list[int]:
        return [len(g.rows) for g in self._fitted().groups_]

    def __len__(self) -> int:
        return len(self._fitted().ids_)

    def _fitted(self) -> SubspaceIndex:
        if not hasattr(self, "groups_"):
            raise NotFittedError("this SubspaceIndex is not fitted; call fit(X) first")
        return self

    def route(self, Xq: RowsLike) -> np.ndarray:
        """Distance of every query to every group's subspace, float64 (Q, G)."""
        self._fitted()
        Zq = self._space(Xq)
        return self._route(Zq - self.center_)

    def _route(self, Zqc: np.ndarray) -> np.ndarray:
        out = np.empty((Zqc.shape[0], len(self.groups_)))
        for g, grp in enumerate(self.groups_):
            out[:, g] = subspace_residuals(Zqc, grp.basis)
        return out

    def query(self, Xq: RowsLike, k: int, *, n_probe: int | None = None,
              n_candidates: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(distances float32 (Q, k), ids int64 (Q, k))``, ascending, ties by id; inf / -1
        where fewer than k rows were re-ranked.  ``n_probe`` and ``n_candidates`` override the
        fitted values for this call."""
        k = check_k(k)
        self._fitted()
        probe = _positive_int("n_probe", self.n_probe if n_probe is None else n_probe)
        cand = _positive_int("n_candidates",
                             self.n_candidates if n_candidates is None else n_candidates)
        Zq = self._space(Xq)
        if Zq.shape[1] != self.payload_.shape[1]:
            raise InputError(f"Xq has {Zq.shape[1]} features, but the index was built on "
                             f"{self.payload_.shape[1]}")
        Zqc = (Zq.astype(np.float64) - self.center_)
        Q = Zq.shape[0]
        sizes = np.array([len(g.rows) for g in self.groups_])
        probed, n_probed = probe_mask(self._route(Zqc), sizes, k, probe)
        chosen: list[list[np.ndarray]] = [[] for _ in range(Q)]
        for g, grp in enumerate(self.groups_):
            qs = np.flatnonzero(probed[:, g])
            if len(qs):
                for q, rows in zip(qs, group_candidates(grp, Zqc[qs], cand)):
                    chosen[q].append(rows)
        counts = np.array([sum(len(r) for r in c) for c in chosen], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = [r for c in chosen for r in c]
        rows = (np.concatenate(flat) if flat else np.zeros(0)).astype(np.int64)
        dist, top = self.payload_.rerank(offsets, rows, DensePayload(Zq), k, self.ids_)
        self.stats_ = {"reranked": counts, "probed": n_probed.astype(np.int64)}
        ids = np.where(top >= 0, self.ids_[np.maximum(top, 0)], -1)
        return dist, ids


def group_seed(seed: int, stream: int, i: int) -> int:
    """The seed of stream ``stream`` (0: Krylov starts, 1: code projections) for round or group
    ``i`` of an index seeded ``seed``: the same in one process and on every worker."""
    return int(np.random.SeedSequence([int(seed), 15, stream, i]).generate_state(1)[0])


def make_group(Zc_rows: np.ndarray, rows: np.ndarray, V: np.ndarray, *, number: int, bits: int,
               seed: int, final: bool) -> Group:
    """Group ``number`` of an index seeded ``seed``: its members' centred rows ``Zc_rows``
    (n_g, d), in id order, their ``rows`` (positions in the payload the group is searched
    with), the subspace ``V`` (d, k); projected coordinates, their mean and r-bit codes.

    The one function that makes a group, in one process (`SubspaceIndex.fit`) and on a worker
    (`lshdist.cluster.subspace`): the same rows in the same order give the same group."""
    Y = np.asarray(Zc_rows).astype(np.float64) @ V
    mean = Y.mean(axis=0)
    rng = np.random.default_rng(group_seed(seed, 1, number))
    R = rng.standard_normal((int(bits), V.shape[1]))
    codes = pack_signs(np.ascontiguousarray((Y - mean) @ R.T))
    return Group(rows=rows, basis=V, mean=mean, coords=Y.astype(np.float32), codes=codes,
                 R=R, final=final)


def probe_mask(route: np.ndarray, sizes: np.ndarray, k: int, n_probe: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Which groups each query searches: its ``n_probe`` nearest subspaces (ties by group
    number), more while they hold fewer than k rows in all.

    Parameters
    ----------
    route : float64 (Q, G), distance of every query to every group's subspace
    sizes : int (G,), rows per group
    k, n_probe : neighbours wanted, groups probed at least

    Returns
    -------
    mask : bool (Q, G), group g searched for query q
    n_probed : int64 (Q,), groups searched per query
    """
    Q, G = route.shape
    order = np.argsort(route, axis=1, kind="stable")
    held = np.cumsum(sizes[order], axis=1)
    enough = np.argmax(held >= min(k, int(sizes.sum())), axis=1) + 1
    n_probed = np.minimum(np.maximum(enough, n_probe), G).astype(np.int64)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(G)[None, :].repeat(Q, axis=0), axis=1)
    return rank < n_probed[:, None], n_probed


def group_candidates(grp: Group, Zqc: np.ndarray, cand: int) -> list[np.ndarray]:
    """Per query (centred rows ``Zqc`` (Q, d)), the rows of ``grp`` nearest in Hamming
    distance of the codes, at most ``cand`` (ties by position, which is id order)."""
    n_g = len(grp.rows)
    if cand >= n_g:
        return [grp.rows] * len(Zqc)
    qcodes = grp.code(Zqc @ grp.basis)
    out: list[np.ndarray] = []
    step = max(1, _HAMMING_BLOCK // n_g)
    pos = np.arange(n_g, dtype=np.int64)
    for lo in range(0, len(qcodes), step):
        qc = qcodes[lo : lo + step]
        ham = np.bitwise_count(qc[:, None, :] ^ grp.codes[None, :, :]).sum(
            axis=2, dtype=np.int64)
        key = ham * n_g + pos  # unique keys: Hamming, then position (= id order)
        sel = np.argpartition(key, cand - 1, axis=1)[:, :cand]
        out.extend(grp.rows[np.sort(s)] for s in sel)
    return out


def search_group(grp: Group, payload: DensePayload, ids: np.ndarray, Zqc: np.ndarray,
                 Zq: np.ndarray, k: int, cand: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k of queries within one group: Hamming candidates re-ranked exactly.

    Parameters
    ----------
    grp : the group; ``grp.rows`` index ``payload`` and ``ids``
    payload : the re-rank rows ``Z`` (learned space, not centred)
    ids : int64, the id of every payload row (ties by id)
    Zqc, Zq : the queries, centred float64 (Q, d) and not centred float32 (Q, d)
    k, cand : neighbours, candidates re-ranked per query

    Returns
    -------
    dist float32 (Q, k), ids int64 (Q, k) (inf / -1 past the candidates), re-ranked int64 (Q,)
    """
    chosen = group_candidates(grp, Zqc, cand)
    counts = np.array([len(c) for c in chosen], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    rows = (np.concatenate(chosen) if chosen else np.zeros(0)).astype(np.int64)
    dist, top = payload.rerank(offsets, rows, DensePayload(Zq), k, ids)
    return dist, np.where(top >= 0, ids[np.maximum(top, 0)], -1), counts
