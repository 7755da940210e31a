"""Information-theoretic metric learning (Davis et al. 2007), explicit and kernelized.

The projections follow ARCHITECTURE.md section 2 exactly; the loops run in
`lshdist._kernels.itml`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from lshdist._kernels.itml import explicit_block, itml_basis, itml_explicit
from lshdist.blocks import Block, BlockT, RowsLike, SparseBlock, as_block, n_rows, take_rows
from lshdist.errors import InputError, NotFittedError
from lshdist.metric.constraints import (
    STRATEGIES,
    Constraints,
    NeighborTable,
    SqDist,
    anchors_needed,
    check_labels_for_constraints,
    check_pairs,
    neighbor_pairs,
    random_pairs,
)
from lshdist.metric.kernels import get_kernel
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric, sq_euclidean
from lshdist.validation import check_finite, check_labels, check_numeric_matrix

log = logging.getLogger(__name__)

#: bounds conventions: the ITML authors' code (default) and the paper
PERCENTILES = {"code": (5.0, 95.0), "paper": (1.0, 99.0)}


def percentile_bounds(sq_dists: np.ndarray, percentiles: tuple[float, float]
                      ) -> tuple[float, float]:
    """``(u, l)``: percentiles of the squared distances (upper bound for similar pairs first)."""
    d = sq_dists[sq_dists > 0]
    if len(d) == 0:
        raise InputError("all sampled points coincide; cannot set distance bounds")
    u, l = np.percentile(d, percentiles)
    return float(u), float(l)


def bound_violation(lengths: np.ndarray, delta: np.ndarray, bounds: tuple[float, float]
                    ) -> tuple[float, float]:
    """How far learned squared lengths are from the constraints' bounds: ``(mean relative
    violation, fraction violated)``, a similar pair (delta +1) violating ``u`` by
    ``max(0, d - u) / u``, a dissimilar one ``l`` by ``max(0, l - d) / l`` (with a finite slack
    gamma the learned metric leaves some violated by design)."""
    u, l = bounds
    r = np.where(delta > 0, np.maximum(lengths - u, 0.0) / u, np.maximum(l - lengths, 0.0) / l)
    return (float(r.mean()), float(np.mean(r > 0))) if len(r) else (0.0, 0.0)


def _sample_sq_dists(X: BlockT, sq_dist: SqDist[BlockT], n_sample: int, rng: np.random.Generator
                     ) -> np.ndarray:
    N = n_rows(X)
    idx = rng.choice(N, size=min(n_sample, N), replace=False)
    Z = take_rows(X, np.sort(idx))
    D = sq_dist(Z, Z)
    out: np.ndarray = D[np.triu_indices(len(idx), 1)]
    return out


def _check_X(X: RowsLike) -> Block:
    X = as_block(X)
    if isinstance(X, SparseBlock):
        check_finite(X.matrix)
        if X.n_rows == 0:
            raise InputError("X is empty (0 rows)")
        return X
    return check_numeric_matrix(X)


class _ITMLParams:
    def __init__(
        self,
        *,
        gamma: float = 1.0,
        max_iter: int = 1000,
        tol: float = 1e-3,
        constraints: str = "neighbors",
        n_constraints: int = 10000,
        n_neighbors: int = 10,
        percentiles: tuple[float, float] | str = "code",
        bounds: tuple[float, float] | None = None,
        bound_sample: int = 200,
        seed: int = 0,
    ):
        self.gamma = gamma
        self.max_iter = max_iter
        self.tol = tol
        self.constraints = constraints
        self.n_constraints = n_constraints
        self.n_neighbors = n_neighbors
        self.percentiles = percentiles
        self.bounds = bounds
        self.bound_sample = bound_sample
        self.seed = seed

    @classmethod
    def _param_names(cls) -> list[str]:
        """The estimator's parameters: the keyword arguments of ``__init__`` along the class
        hierarchy (a subclass passes the ones it does not name on with ``**kw``), sorted."""
        names: set[str] = set()
        for klass in cls.__mro__:
            init = vars(klass).get("__init__")
            if init is None or klass is object:
                continue
            names.update(p.name for p in inspect.signature(init).parameters.values()
                         if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        return sorted(names)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The parameters given to ``__init__`` (scikit-learn's protocol: ``clone`` works).

        Parameters
        ----------
        deep : bool
            Accepted for scikit-learn's sake; no parameter is itself an estimator.

        Returns
        -------
        dict
            Parameter name to value, as stored.
        """
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Any:
        """Set parameters by name (checked when ``fit`` runs); returns the estimator.

        Raises
        ------
        InputError
            For a name that is not a parameter of this estimator.
        """
        names = self._param_names()
        for key, value in params.items():
            if key not in names:
                raise InputError(f"{key!r} is not a parameter of {type(self).__name__}; its "
                                 f"parameters are {', '.join(names)}")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        init = {n: p.default for klass in reversed(type(self).__mro__)
                if "__init__" in vars(klass) and klass is not object
                for n, p in inspect.signature(vars(klass)["__init__"]).parameters.items()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if not (isinstance(v, (str, int, float, bool, tuple, type(None)))
                           and v == init.get(k))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _validate_params(self) -> tuple[float, float]:
        if self.constraints not in STRATEGIES:
            raise InputError(
                f"constraints={self.constraints!r}; choose one of {list(STRATEGIES)}"
            )
        if not (self.gamma > 0):
            raise InputError(
                f"gamma={self.gamma}: the slack must be > 0 (inf for hard constraints)"
            )
        if self.max_iter < 1:
            raise InputError(f"max_iter={self.max_iter}: must be >= 1")
        if self.n_constraints < 2:
            raise InputError(f"n_constraints={self.n_constraints}: must be >= 2")
        pct = self.percentiles
        if isinstance(pct, str):
            if pct not in PERCENTILES:
                raise InputError(f"percentiles={pct!r}; choose {sorted(PERCENTILES)} or a pair")
            pct = PERCENTILES[pct]
        values = tuple(float(p) for p in pct)
        if not (len(values) == 2 and 0 <= values[0] < values[1] <= 100):
            raise InputError(f"percentiles={values}: need two numbers 0 <= lower < upper <= 100")
        return values[0], values[1]

    def _constraints(self, X: BlockT, y: ArrayLike | None, pairs: ArrayLike | None,
                     delta: ArrayLike | None, sq_dist: SqDist[BlockT], rng: np.random.Generator,
                     table: NeighborTable | None = None) -> Constraints:
        N = n_rows(X)
        if pairs is not None:
            return check_pairs(pairs, delta, N)
        if y is None:
            raise InputError("give labels y or explicit pairs (with +1/-1 pair labels)")
        labels = check_labels(y, N)
        check_labels_for_constraints(labels)
        if self.constraints == "random":
            return random_pairs(labels, self.n_constraints, rng)
        return neighbor_pairs(X, labels, self.n_constraints, self.n_neighbors, rng, sq_dist,
                              table)

    def _bounds(self, X: BlockT, sq_dist: SqDist[BlockT], pct: tuple[float, float],
                rng: np.random.Generator) -> tuple[float, float]:
        if self.bounds is not None:
            u, l = (float(b) for b in self.bounds)
            if not (0 < u <= l):
                raise InputError(f"bounds={self.bounds}: need 0 < u <= l")
            return u, l
        return percentile_bounds(_sample_sq_dists(X, sq_dist, self.bound_sample, rng), pct)


class ITML(_ITMLParams):
    """Explicit ITML: learns a d x d matrix ``A = G^T G`` (a scikit-learn-shaped estimator).

    ``fit(X, y)`` draws similar and dissimilar pairs from the labels (``constraints``) and
    learns ``A`` so that similar pairs fall within ``u`` and dissimilar ones beyond ``l``;
    ``transform(X)`` gives ``G x``, on which Euclidean distance is the learned distance.
    Parameters are keyword-only and stored as given (`get_params`, `set_params`,
    ``sklearn.base.clone`` work); they are checked by `fit`.

    Parameters
    ----------
    prior : {"identity", "inverse-covariance"} or array-like (d, d)
        The prior ``A0`` the learned matrix stays close to (a matrix: positive definite).
    gamma : float
        Slack trade-off (``inf``: hard constraints).
    max_iter : int
        Passes over the constraints at most.
    tol : float
        Stop when the dual variables change by less than this (metric-learn's rule).
    constraints : {"neighbors", "random"}
        How pairs are drawn from labels: same-label neighbours and different-label impostors
        of sampled anchors, or random pairs.
    n_constraints : int
        Pairs drawn from the labels.
    n_neighbors : int
        Neighbours per anchor (``constraints="neighbors"``).
    percentiles : {"code", "paper"} or (float, float)
        The bounds ``u, l`` are these percentiles of the squared distances (under the prior)
        of ``bound_sample`` random points: ``"code"`` 5th/95th (the authors' code), ``"paper"``
        1st/99th.
    bounds : (float, float), optional
        Explicit ``(u, l)``; overrides ``percentiles``.
    bound_sample : int
        Rows sampled for the percentile bounds.
    seed : int
        Seeds the constraint and sample draws.

    Attributes
    ----------
    A_ : ndarray, float64 (d, d)
        The learned matrix.
    center_ : ndarray, float32 (d,)
        Mean of the training rows (where hash hyperplanes pass through).
    bounds_ : (float, float)
        The ``(u, l)`` used.
    pairs_, delta_ : ndarray (n, 2), ndarray (n,)
        The constraints: row pairs and +1 (similar) / -1 (dissimilar).
    n_iter_ : int
        Passes made.
    conv_ : float
        The last pass's change of the dual variables.
    d_ : int
        Features.
    """

    def __init__(self, *, prior: str | ArrayLike = "identity", **kw: Any) -> None:
        super().__init__(**kw)
        self.prior = prior

    def _prior(self, X: np.ndarray) -> np.ndarray:
        d = X.shape[1]
        if isinstance(self.prior, str):
            if self.prior == "identity":
                return np.eye(d)
            if self.prior in ("inverse-covariance", "covariance"):
                C = np.cov(X.astype(np.float64), rowvar=False).reshape(d, d)
                return np.linalg.pinv(C + 1e-9 * np.trace(C) / d * np.eye(d))
            raise InputError(
                f"prior={self.prior!r}; choose 'identity', 'inverse-covariance' or give a matrix"
            )
        A0 = np.asarray(self.prior, np.float64)
        if A0.shape != (d, d):
            raise InputError(
                f"the prior has shape {A0.shape}, but X has {d} features: need ({d}, {d})"
            )
        return A0

    def fit(self, X: RowsLike, y: ArrayLike | None = None, *, pairs: ArrayLike | None = None,
            delta: ArrayLike | None = None, neighbors: NeighborTable | None = None) -> ITML:
        """Learn ``A`` from labels ``y`` or from ``pairs`` (n, 2) with ``delta`` (+1/-1).
        ``neighbors``: the anchors' neighbours computed before (`neighbor_table`), shared by
        fits on the same rows; the same pairs with or without it."""
        pct = self._validate_params()
        X = check_numeric_matrix(X)
        rng = np.random.default_rng(self.seed)
        A0 = self._prior(X)
        prior_metric = ExplicitMetric(A0)
        Z = prior_metric.transform(X)
        pairs_, delta_ = self._constraints(Z, y, pairs, delta, sq_euclidean, rng, neighbors)
        u, l = self._bounds(Z, sq_euclidean, pct, rng)
        V = X[pairs_[:, 0]].astype(np.float64) - X[pairs_[:, 1]].astype(np.float64)
        xi = np.where(delta_ > 0, u, l).astype(np.float64)
        A = np.ascontiguousarray(A0.copy())
        n_iter, conv = itml_explicit(
            A, np.ascontiguousarray(V), delta_, xi, np.zeros(len(V)), float(self.gamma),
            int(self.max_iter), float(self.tol), explicit_block(A.shape[0]),
        )
        self.A_ = 0.5 * (A + A.T)
        self.violation_, self.violated_ = bound_violation(
            np.einsum("ij,ij->i", V @ self.A_, V), delta_, (u, l))
        log.info("ITML: %d constraints, %d passes, conv %.2e, violation %.3f", len(V), n_iter,
                 conv, self.violation_)
        self.bounds_ = (u, l)
        self.pairs_, self.delta_ = pairs_, delta_
        self.n_iter_, self.conv_ = n_iter, conv
        self.d_ = X.shape[1]
        self.center_ = X.mean(axis=0, dtype=np.float64).astype(np.float32)
        return self

    def neighbor_table(self, X: RowsLike, neighbors: list[int], *, n_threads: int = 1
                       ) -> NeighborTable:
        """The neighbours of the anchors that `fit` on ``X`` with labels draws, for each of
        ``neighbors`` (neighbours per anchor) with this estimator's seed, prior and number of
        constraints — computed once (``n_threads`` BLAS threads) for several fits."""
        self._validate_params()
        if not neighbors:
            raise InputError("a neighbour table needs the neighbours per anchor of at least "
                             "one fit")
        X = check_numeric_matrix(X)
        N = X.shape[0]
        Z = ExplicitMetric(self._prior(X)).transform(X)
        order = np.random.default_rng(self.seed).permutation(N)  # fit's first draw
        ks = [int(min(k, N - 1)) for k in neighbors]
        return NeighborTable.build(
            Z, order, max(anchors_needed(self.n_constraints, k, N) for k in ks), max(ks),
            sq_euclidean, n_threads=n_threads)

    def metric(self) -> ExplicitMetric:
        if not hasattr(self, "A_"):
            raise NotFittedError("this ITML is not fitted yet; call fit(X, y) first")
        return ExplicitMetric(self.A_, center=self.center_)

    def transform(self, X: RowsLike) -> np.ndarray:
        """Map rows to ``G x`` (``A = G^T G``): Euclidean distances between the transformed
        rows are the learned distances, for any tool that knows only L2.

        Parameters
        ----------
        X : array-like (n, d)
            Dense rows with the ``d`` features the metric was learned on.

        Returns
        -------
        ndarray, float32 (n, d)

        Raises
        ------
        NotFittedError
            Before `fit`.
        InputError
            For rows of another width, or sparse rows.
        """
        return self.metric().transform(X)


def _inv_sqrt_psd(K0: np.ndarray, rtol: float = 1e-10) -> tuple[np.ndarray, int]:
    """``K0^{-1/2}`` on the range of K0 (pseudo-inverse square root) and the rank kept."""
    w, U = np.linalg.eigh(0.5 * (K0 + K0.T))
    keep = w > rtol * max(w.max(), 0.0)
    if not keep.any():
        raise InputError("the basis kernel matrix K0 is zero; choose other basis points")
    Ur, wr = U[:, keep], w[keep]
    isqrt: np.ndarray = (Ur / np.sqrt(wr)) @ Ur.T
    return isqrt, int(keep.sum())


def _sqrt_psd(W: np.ndarray) -> np.ndarray:
    w, U = np.linalg.eigh(0.5 * (W + W.T))
    out: np.ndarray = (U * np.sqrt(np.maximum(w, 0.0))) @ U.T
    return out


class KernelITML(_ITMLParams):
    """Kernelized ITML over c basis points: ``G = I + Phi S Phi^T`` (an `ImplicitMetric`).

    Two routes (ARCHITECTURE.md section 2):

    ``route="span"`` (default) — constraints among any points: learn a c x c ``W`` by explicit
    ITML on the span coordinates ``psi(x) = K0^{-1/2} Phi^T phi(x)`` with
    ``||(I-P)(a-b)||^2`` added to every projected length; then
    ``S = K0^{-1/2} (W^{1/2} - I) K0^{-1/2}``.

    ``route="basis"`` — constraints among basis points only: eq. 5 on ``K`` and Lemma 2 on ``S``.

    The metric is implicit (``G`` acts on the kernel's feature space): it has no
    ``transform``; `lshdist.MetricIndex` searches under it.  Dense or sparse rows.

    Parameters
    ----------
    kernel : str
        Base kernel name (``"linear"``).
    n_basis : int
        c, basis points drawn at random (seeded) from X.
    basis : array-like of int, optional
        Explicit basis row indices into X (overrides ``n_basis``).
    route : {"span", "basis"}
        Constraints among any rows (span coordinates) or among basis points only.
    rank_rtol : float
        Eigenvalues of K0 below ``rank_rtol * max`` are treated as zero (a singular K0, e.g.
        duplicate basis points, is reported and handled on its range, never inverted).
    n_constraints : int
        Pairs drawn from the labels (2,000: on 20 Newsgroups, c=300 and 2,000 neighbour pairs
        converge in about 45 passes, 7 s; c=500 with 5,000 pairs took 112 s for the same
        accuracy).
    max_iter : int
        Passes over the constraints at most.
    gamma, tol, constraints, n_neighbors, percentiles, bounds, bound_sample, seed
        As `ITML`.

    Attributes
    ----------
    S_ : ndarray, float64 (c, c)
        The learned ``S`` of ``G = I + Phi S Phi^T``.
    basis_ : ndarray or SparseBlock (c rows)
        The basis rows; ``basis_index_`` their row numbers in X.
    K0_ : ndarray, float64 (c, c)
        Kernel matrix of the basis.
    bounds_, pairs_, delta_, n_iter_, conv_
        As `ITML`.
    """

    def __init__(self, *, kernel: str = "linear", n_basis: int = 300,
                 basis: ArrayLike | None = None, route: str = "span", rank_rtol: float = 1e-10,
                 n_constraints: int = 2000, max_iter: int = 100, **kw: Any) -> None:
        super().__init__(n_constraints=n_constraints, max_iter=max_iter, **kw)
        self.kernel = kernel
        self.n_basis = n_basis
        self.basis = basis
        self.route = route
        self.rank_rtol = rank_rtol

    def _basis_index(self, N: int, rng: np.random.Generator) -> np.ndarray:
        if self.basis is not None:
            b = np.asarray(self.basis)
            if b.ndim != 1 or b.dtype.kind not in "iu" or len(b) == 0:
                raise InputError("basis must be a non-empty 1-d array of row indices")
            if b.min() < 0 or b.max() >= N:
                raise InputError(f"basis index {int(b.max())} out of range for {N} points")
            return b.astype(np.int64)
        c = int(self.n_basis)
        if c < 2:
            raise InputError(f"n_basis={c}: need at least 2 basis points")
        if c > N:
            raise InputError(
                f"c={c} basis points requested, but the data has only {N} points; "
                f"choose c <= {N}"
            )
        return np.sort(rng.choice(N, size=c, replace=False))

    def fit(self, X: RowsLike, y: ArrayLike | None = None, *, pairs: ArrayLike | None = None,
            delta: ArrayLike | None = None) -> KernelITML:
        pct = self._validate_params()
        if self.route not in ("span", "basis"):
            raise InputError(f"route={self.route!r}; choose 'span' or 'basis'")
        X = _check_X(X)
        kern = get_kernel(self.kernel)
        rng = np.random.default_rng(self.seed)
        N = n_rows(X)
        bidx = self._basis_index(N, rng)
        basis = take_rows(X, bidx)
        c = len(bidx)
        K0 = kern(basis, basis)

        def sq_dist(A: Block, B: Block) -> np.ndarray:
            D = kern.diag(A)[:, None] + kern.diag(B)[None, :] - 2 * kern(A, B)
            out: np.ndarray = np.maximum(D, 0.0)
            return out

        if self.route == "basis":
            yb = None if y is None else check_labels(y, N)[bidx]
            pairs_, delta_ = self._constraints(basis, yb, pairs, delta, sq_dist, rng)
            u, l = self._bounds(X, sq_dist, pct, rng)
            S = np.zeros((c, c))
            K = np.ascontiguousarray(K0.copy())
            xi = np.where(delta_ > 0, u, l).astype(np.float64)
            n_iter, conv = itml_basis(
                np.ascontiguousarray(K0), S, K, pairs_[:, 0].copy(), pairs_[:, 1].copy(),
                delta_, xi, float(self.gamma), int(self.max_iter), float(self.tol),
            )
            self.K_: np.ndarray | None = K
            self.W_: np.ndarray | None = None
            i, j = pairs_[:, 0], pairs_[:, 1]
            lengths = K[i, i] + K[j, j] - 2 * K[i, j]
        else:
            pairs_, delta_ = self._constraints(X, y, pairs, delta, sq_dist, rng)
            u, l = self._bounds(X, sq_dist, pct, rng)
            K0_isqrt, rank = _inv_sqrt_psd(K0, self.rank_rtol)
            if rank < c:
                log.warning(
                    "K0 is singular (rank %d of %d, duplicate or dependent basis points): "
                    "learning on its range", rank, c,
                )
            used = np.unique(pairs_)
            rows = take_rows(X, used)
            kx = kern(rows, basis)  # (n_used, c)
            psi = kx @ K0_isqrt
            pos = np.searchsorted(used, pairs_)
            V = psi[pos[:, 0]] - psi[pos[:, 1]]
            diag = kern.diag(rows)
            base = np.maximum(
                diag[pos[:, 0]] + diag[pos[:, 1]]
                - 2 * kern.paired(take_rows(rows, pos[:, 0]), take_rows(rows, pos[:, 1])),
                0.0,
            )
            offsets = np.maximum(base - np.einsum("ij,ij->i", V, V), 0.0)
            W = np.eye(c)
            xi = np.where(delta_ > 0, u, l).astype(np.float64)
            n_iter, conv = itml_explicit(
                W, np.ascontiguousarray(V), delta_, xi, offsets, float(self.gamma),
                int(self.max_iter), float(self.tol), explicit_block(c),
            )
            W = 0.5 * (W + W.T)
            lengths = np.einsum("ij,ij->i", V @ W, V) + offsets
            S = K0_isqrt @ (_sqrt_psd(W) - np.eye(c)) @ K0_isqrt
            self.W_ = W
            self.K_ = None
        self.violation_, self.violated_ = bound_violation(lengths, delta_, (u, l))
        log.info("kernel ITML (%s route): c=%d, %d constraints, %d passes, conv %.2e, "
                 "violation %.3f", self.route, c, len(pairs_), n_iter, conv, self.violation_)
        self.basis_index_ = bidx
        self.basis_ = basis
        self.K0_ = K0
        self.S_ = S
        self.bounds_ = (u, l)
        self.pairs_, self.delta_ = pairs_, delta_
        self.n_iter_, self.conv_ = n_iter, conv
        self.d_ = X.shape[1] if not isinstance(X, SparseBlock) else None
        return self

    def metric(self, d: int | None = None) -> ImplicitMetric:
        if not hasattr(self, "S_"):
            raise NotFittedError("this KernelITML is not fitted yet; call fit(X, y) first")
        dim = self.d_ if self.d_ is not None else d
        if dim is None:
            raise InputError("give d (the feature space size) for a metric over sparse rows")
        return ImplicitMetric(self.basis_, self.S_, kernel=self.kernel, d=dim)
