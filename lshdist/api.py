"""The public Python API: what `lshdist` exports.

- `ITML`, `KernelITML`: metric learning, scikit-learn-shaped (`fit(X, y)`, `transform`,
  `get_params` / `set_params`, ``sklearn.base.clone``);
- `MetricIndex`: hash-and-search under a learned metric (or L2) in this process, with
  scikit-learn's ``kneighbors``;
- `ingest`, `learn`, `build_index`, `query_index`: the jobs of the command line as functions,
  on a caller's ``distributed.Client`` or on a LocalCluster they start as the CLI does;
  `read_results`: a query job's results as a pandas DataFrame.

Options of the job functions are the fields of the typed configuration (`lshdist.config`:
`LearnConfig`, `IndexConfig`, `QueryConfig`, `ClusterConfig`), by name; defaults live there.
An unknown option, or a value outside its rule, is an `InputError` naming it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import scipy.sparse as sp

from lshdist.config import (
    KNN_MODES,
    ClusterConfig,
    IndexConfig,
    LearnConfig,
    QueryConfig,
    Section,
    check_mode,
    from_mapping,
)
from lshdist.errors import InputError, NotFittedError
from lshdist.metric.itml import ITML, KernelITML

if TYPE_CHECKING:
    from lshdist.blocks import RowsLike
    from lshdist.index.calibrate import Calibration
    from lshdist.protocols import Metric

__all__ = ["ITML", "KernelITML", "MetricIndex", "build_index", "ingest", "learn",
           "query_index", "read_results"]

PathLike = str | os.PathLike[str]
S = TypeVar("S", bound=Section)
T = TypeVar("T")

#: a dask array is brought into this process only if it takes at most this fraction of the
#: memory the process may still allocate (`lshdist.limits.available_memory`)
DASK_MEMORY_FRACTION = 0.25


# ------------------------------------------------------------------------------ inputs


def _is_dask(X: Any) -> bool:
    da = sys.modules.get("dask.array")
    return da is not None and isinstance(X, da.Array)


def local_rows(X: Any, *, name: str = "X") -> RowsLike:
    """``X`` as rows this process can search: numpy arrays and scipy sparse matrices as they
    are; a dask array computed, if it fits (`DASK_MEMORY_FRACTION` of the memory available),
    else an `InputError` pointing to the distributed jobs."""
    if not _is_dask(X):
        return X
    from lshdist.limits import available_memory

    free = available_memory()
    nbytes = float(X.nbytes)
    if np.isnan(nbytes):
        raise InputError(f"{name} is a dask array of unknown size (chunks {X.chunks}); compute "
                         "its chunk sizes first (X.compute_chunk_sizes())")
    if free is not None and nbytes > DASK_MEMORY_FRACTION * free:
        raise InputError(
            f"{name} is a dask array of {nbytes / 1e9:.2f} GB, more than "
            f"{DASK_MEMORY_FRACTION:.0%} of the {free / 1e9:.2f} GB this process may still "
            "allocate; write it to a dataset (lshdist.ingest, e.g. from its .to_zarr() or "
            "Parquet files) and use lshdist.build_index / lshdist.query_index on the cluster")
    return X.compute()


def _width(X: Any) -> int:
    """Features of rows ``X``: a matrix's columns; a `SparseBlock`'s hashed 64-bit ids."""
    from lshdist.blocks import SparseBlock
    from lshdist.store.dataset import HASHED_D

    if isinstance(X, SparseBlock):
        return HASHED_D
    shape = getattr(X, "shape", None) or np.shape(X)
    return int(shape[1]) if len(shape) == 2 else 0


def _metric_of(metric: Any, X: RowsLike) -> Metric:
    """The search metric of `MetricIndex`'s ``metric`` argument, for database rows ``X``."""
    from lshdist.blocks import SparseBlock, as_block, take_rows
    from lshdist.metric.learned import ExplicitMetric, ImplicitMetric

    if isinstance(metric, (ExplicitMetric, ImplicitMetric)):
        return metric
    if isinstance(metric, ITML):
        return metric.metric()
    B = as_block(X)
    sparse = isinstance(B, SparseBlock)
    if isinstance(metric, KernelITML):
        return metric.metric(d=_width(X) if sparse else None)
    if isinstance(metric, (str, os.PathLike)):
        from lshdist.store.model import load_model

        found, _ = load_model(metric)
        return found
    if metric is not None:
        raise InputError(f"metric={type(metric).__name__}: give a fitted lshdist.ITML or "
                         "lshdist.KernelITML, the path of a model written by lshdist.learn, or "
                         "None for the Euclidean distance")
    if isinstance(B, SparseBlock):  # L2: the kernelized form with S = 0 (one basis row, unused)
        return ImplicitMetric.identity(take_rows(B, np.zeros(1, np.int64)), d=_width(X))
    rows = np.asarray(B)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise InputError(f"X has shape {rows.shape}: give a 2-d array with at least one row")
    return ExplicitMetric.identity(rows.shape[1], center=rows.mean(axis=0, dtype=np.float64))


# ------------------------------------------------------------------------------ index


class MetricIndex:
    """Nearest neighbours under a learned metric (or L2), hashed or by exact scan, in this
    process.

    The rows are hashed with the metric's learned hash functions into permutation-sorted
    lists; with a ``target_recall`` the search parameters (lists ``M``, window ``W``, Hamming
    filter ``H``) are calibrated on first use to reach that recall@``calibration_k`` against
    the exact scan at the least cost, and ``mode="auto"`` answers by the exact scan where that
    is no slower.

    Parameters
    ----------
    metric : ITML, KernelITML, str or path-like, optional
        A fitted estimator, the directory of a model written by `learn`, or None for the
        Euclidean distance.
    target_recall : float or None
        Recall@``calibration_k`` to calibrate for; None: no calibration (``W=1``, ``H=0``,
        ``M`` from ``permutations`` or ``epsilon``).
    calibration_k : int
        The k of the calibrated recall.
    bits : int, optional
        Bits per hash key; default 512 (`lshdist.config.default_key_bits`).
    permutations : int, optional
        M, permutation-sorted lists (fixed; default calibrated).
    epsilon : float, optional
        M = ceil(2 n^(1/(1+epsilon))) (fixed; default calibrated).
    window : int, optional
        W, list entries taken on each side of a query (fixed; default calibrated).
    hamming_keep : int, optional
        H, candidates kept by Hamming distance before the exact re-rank, 0 all (fixed; default
        calibrated).
    baseline : bool
        Charikar's random hyperplanes instead of the learned hash functions.
    calibration_queries : array-like, optional
        Rows like the real queries to calibrate with (default: a sample of the database's own
        rows, leave-one-out).
    check_recall : bool
        A hashed query also answers a seeded sample of its rows by the exact scan and records
        the recall it measured (``measured_recall_``); under ``mode="auto"`` a shortfall
        re-calibrates or answers by the scan.
    seed : int
        Seeds the hash functions and permutations.
    n_threads : int, optional
        Threads of the build and the searches (default: the cores available).

    Attributes
    ----------
    metric_ : object
        The metric searched under (``ExplicitMetric`` or ``ImplicitMetric``).
    index_ : lshdist.index.searcher.MetricIndex
        The underlying index.
    n_samples_fit_ : int
        Rows indexed.
    n_features_in_ : int
        Features of the rows.
    calibration_ : Calibration or None
        The calibration curve and the chosen point (computed on first use).
    mode_ : str
        What ``mode="auto"`` answers with (``"hash"`` or ``"scan"``).
    last_mode_ : str
        The mode the last `kneighbors` ran in.
    measured_recall_ : object or None
        What the last hashed query measured on a sample of its rows.

    Examples
    --------
    >>> model = lshdist.ITML().fit(X, y)                                # doctest: +SKIP
    >>> index = lshdist.MetricIndex(model).fit(X)                       # doctest: +SKIP
    >>> dist, ids = index.kneighbors(Q, n_neighbors=10)                 # doctest: +SKIP
    """

    def __init__(self, metric: Any = None, *,
                 target_recall: float | None = IndexConfig.target_recall,
                 calibration_k: int = IndexConfig.k, bits: int | None = None,
                 permutations: int | None = IndexConfig.permutations,
                 epsilon: float | None = IndexConfig.epsilon,
                 window: int | None = IndexConfig.window,
                 hamming_keep: int | None = IndexConfig.hamming_keep,
                 baseline: bool = IndexConfig.baseline,
                 calibration_queries: Any = None,
                 check_recall: bool = QueryConfig.check_recall,
                 seed: int = IndexConfig.seed, n_threads: int | None = None) -> None:
        self.metric = metric
        self.target_recall = target_recall
        self.calibration_k = calibration_k
        self.bits = bits
        self.permutations = permutations
        self.epsilon = epsilon
        self.window = window
        self.hamming_keep = hamming_keep
        self.baseline = baseline
        self.calibration_queries = calibration_queries
        self.check_recall = check_recall
        self.seed = seed
        self.n_threads = n_threads

    # scikit-learn's parameter protocol, as the estimators have it
    _param_names: Any = classmethod(ITML._param_names.__func__)  # type: ignore[attr-defined]
    get_params = ITML.get_params
    set_params = ITML.set_params
    __repr__ = ITML.__repr__

    def _threads(self) -> int:
        from lshdist.limits import available_cores

        if self.n_threads is None:
            return available_cores()
        if isinstance(self.n_threads, bool) or not isinstance(self.n_threads, int) \
                or self.n_threads < 1:
            raise InputError(f"n_threads={self.n_threads!r}: give an integer >= 1 or None")
        return self.n_threads

    def fit(self, X: Any, ids: Any = None) -> MetricIndex:
        """Hash and index the rows ``X``.

        Parameters
        ----------
        X : ndarray (n, d), scipy sparse matrix (n, d) or dask array
            The database rows (float32 internally; a dask array is computed if it fits in
            memory).
        ids : array-like of int (n,), optional
            Unique int64 ids that `kneighbors` returns for the rows (default ``0..n-1``).

        Returns
        -------
        MetricIndex
            self, fitted.

        Raises
        ------
        NotFittedError
            For an unfitted ``metric`` estimator.
        InputError
            For rows the metric cannot take (other width, sparse for a dense metric,
            NaN), ids of another length or repeated, bad parameters.
        """
        from lshdist.blocks import as_block, n_rows
        from lshdist.index.searcher import MetricIndex as Searcher

        X = local_rows(X)
        metric = _metric_of(self.metric, X)
        B = as_block(X)  # a scipy matrix becomes a SparseBlock, a list an array
        n = n_rows(B)
        if ids is not None:
            ids = np.asarray(local_rows(ids, name="ids"))
            if ids.shape != (n,) or (ids.size and ids.dtype.kind not in "iu"):
                raise InputError(f"ids has shape {ids.shape} and dtype {ids.dtype}, but X has "
                                 f"{n} rows: give {n} integer ids")
            ids = ids.astype(np.int64)
            if len(np.unique(ids)) != n:
                raise InputError("ids are not unique: give one distinct id per row")
        cq = self.calibration_queries
        searcher = Searcher(
            metric, bits=self.bits, n_permutations=self.permutations, epsilon=self.epsilon,
            window=self.window, hamming_keep=self.hamming_keep, learned=not self.baseline,
            seed=self.seed, target_recall=self.target_recall,
            calibration_k=self.calibration_k, check_recall=self.check_recall,
            calibration_queries=None if cq is None else local_rows(cq,
                                                                   name="calibration_queries"))
        self.index_ = searcher.fit(B, ids, n_threads=self._threads())
        self.metric_ = metric
        self.n_samples_fit_ = n
        self.n_features_in_ = _width(X)
        return self

    def _fitted(self) -> Any:
        if not hasattr(self, "index_"):
            raise NotFittedError("this MetricIndex is not fitted yet; call fit(X) first")
        return self.index_

    def kneighbors(self, X: Any, n_neighbors: int = QueryConfig.k, return_distance: bool = True,
                   mode: str = QueryConfig.mode) -> Any:
        """The ``n_neighbors`` nearest indexed rows of every row of ``X``.

        Parameters
        ----------
        X : ndarray (q, d), scipy sparse matrix (q, d) or dask array
            Query rows.
        n_neighbors : int
            Neighbours per query, at most the rows indexed.
        return_distance : bool
            Return the distances too (as scikit-learn's ``kneighbors``).
        mode : {"auto", "hash", "scan"}
            ``"auto"``: the calibration's choice (hashed at the calibrated point, or the exact
            scan where that is no slower); ``"hash"``; ``"scan"``: exact.

        Returns
        -------
        distances : ndarray, float32 (q, n_neighbors)
            Learned squared distances ``d_A(x, q) = (x - q)^T A (x - q)``, ascending per row
            (the ``distance`` column of `read_results`).  Only with ``return_distance``.
        indices : ndarray, int64 (q, n_neighbors)
            Ids of the neighbours (``fit``'s ``ids``, default row numbers); -1 where a hashed
            search found fewer than ``n_neighbors`` candidates.

        Raises
        ------
        NotFittedError
            Before `fit`.
        InputError
            For a bad ``n_neighbors`` or ``mode``, or query rows the metric cannot take.
        """
        index = self._fitted()
        if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, (int, np.integer)) \
                or n_neighbors < 1:
            raise InputError(f"n_neighbors={n_neighbors!r}: n_neighbors must be an integer >= 1")
        if n_neighbors > self.n_samples_fit_:
            raise InputError(f"n_neighbors={n_neighbors}, but the index holds "
                             f"{self.n_samples_fit_} rows: ask for at most "
                             f"{self.n_samples_fit_}")
        check_mode(mode, KNN_MODES)
        from lshdist.blocks import as_block

        dist, ids = index.query(as_block(local_rows(X)), int(n_neighbors), mode=mode,
                                n_threads=self._threads())
        return (dist, ids) if return_distance else ids

    @property
    def calibration_(self) -> Calibration | None:
        """The calibration (curve and chosen point), computed on first use; None without a
        ``target_recall``."""
        cal: Calibration | None = self._fitted().calibration_
        return cal

    @property
    def mode_(self) -> str:
        """What ``kneighbors(mode="auto")`` answers with: ``"hash"`` or ``"scan"``."""
        return str(self._fitted().mode_)

    @property
    def last_mode_(self) -> str | None:
        """The mode the last `kneighbors` ran in (None before the first)."""
        return getattr(self._fitted(), "last_mode_", None)

    @property
    def measured_recall_(self) -> Any:
        """What the last hashed `kneighbors` measured on a sample of its rows (recall@k,
        its interval, and what was done about a shortfall); None where nothing was measured."""
        return getattr(self._fitted(), "measured_recall_", None)

    @property
    def query_calibration_(self) -> Calibration | None:
        """The calibration on a sample of a bulk query's own rows, where one ran."""
        return getattr(self._fitted(), "query_calibration_", None)


# ------------------------------------------------------------------------------ jobs


def _field_names(cls: type[Section]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if "rule" in f.metadata}


def _split_options(options: dict[str, Any], where: str, *sections: type[Section]
                   ) -> list[Section]:
    """The typed sections of a job's keyword options (each a field of one section)."""
    allowed = set().union(*(_field_names(cls) for cls in sections))
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InputError(f"{where}: unknown option {unknown[0]!r}; the options are "
                         f"{', '.join(sorted(allowed))}")
    return [from_mapping(cls, {k: v for k, v in options.items() if k in _field_names(cls)},
                         where=where) for cls in sections]


def _check_client(client: Any, cluster: ClusterConfig, where: str) -> None:
    """Options that describe a cluster to start are refused beside a caller's client."""
    started = sorted(cluster.given_ - {"stall_timeout"})
    if client is not None and started:
        raise InputError(f"{where}: {', '.join(started)} describe a cluster to start, but "
                         "client= is given and nothing is started; drop them")


def _on_cluster(client: Any, cluster: ClusterConfig, work: Callable[[Any], T]) -> T:
    """Run ``work(client)`` on the caller's ``client`` (nothing started), or on the cluster
    the options describe, started and stopped here as the command line does."""
    if client is not None:
        return work(client)
    from lshdist.cluster.client import client_for

    with client_for(cluster) as own:
        return work(own)


def ingest(inputs: Any, out: PathLike, *, labels: Any = None, ids: Any = None,
           format: str | None = None, label_column: str | int | None = None,
           header: bool | None = None, id_column: str | int | None = None,
           id_offset: int = 0, weighting: str | None = None,
           idf_from: PathLike | None = None, rows: tuple[int, int] | None = None,
           shard_rows: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write data files, or arrays, as a sharded dataset (``lshdist ingest``).

    Parameters
    ----------
    inputs : path, sequence of paths, ndarray, scipy sparse matrix or dask array
        Data files or dataset directories, concatenated in order (formats detected, or
        ``format``); or the rows themselves (n, d).
    out : path
        The dataset directory to write (atomically).
    labels : sequence of paths or array-like, optional
        Files: one ``.npy`` labels file per input without labels of its own.  Arrays: the
        labels (n,).
    ids : array-like of int (n,), optional
        Arrays only: unique int64 row ids (default ``0..n-1``, plus ``id_offset``).
    format : str, optional
        The format of every input file (``lshdist ingest --help`` lists them).
    label_column, id_column : str or int, optional
        CSV/Parquet: the label column and the column of row ids.
    header : bool, optional
        CSV: whether there is a header row (default: guessed).
    id_offset : int
        Added to every row id.
    weighting : {"tfidf", "counts"}, optional
        Text inputs: token weights.
    idf_from : path, optional
        Text inputs: use this dataset's IDF.
    rows : (int, int), optional
        Keep rows ``start:stop`` of the concatenated input (they keep their ids).
    shard_rows : int, optional
        Rows per shard (default: the dataset store's).
    overwrite : bool
        Replace an existing dataset at ``out``.

    Returns
    -------
    dict
        What `lshdist info` shows of the dataset: ``path``, ``N``, ``d``, ``kind``,
        ``shards``, ``classes``, ...
    """
    from lshdist.store.atomic import check_output
    from lshdist.store.dataset import DEFAULT_SHARD_ROWS, write_dataset

    shards = DEFAULT_SHARD_ROWS if shard_rows is None else shard_rows
    check_output(out, overwrite)  # refuse before reading anything
    if isinstance(inputs, (str, os.PathLike)) or (
            isinstance(inputs, Sequence) and inputs and all(
                isinstance(p, (str, os.PathLike)) for p in inputs)):
        if ids is not None:
            raise InputError("ingest: ids= is for array inputs; files carry their ids "
                             "(an id column, an .npz 'ids' array) or are numbered")
        from lshdist.inputs import read_inputs

        paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
        data = read_inputs(paths, format=format, labels=labels, label_column=label_column,
                           header=header, id_column=id_column, id_offset=id_offset,
                           weighting=weighting, idf_from=idf_from)
        if rows is not None:
            data = data.rows(*rows)
        summary: dict[str, Any] = data.write(out, shard_rows=shards,
                                             overwrite=overwrite).summary()
        return summary
    given = [name for name, v in (("format", format), ("label_column", label_column),
                                  ("header", header), ("id_column", id_column),
                                  ("weighting", weighting), ("idf_from", idf_from))
             if v is not None]
    if given:
        raise InputError(f"ingest: {', '.join(given)} apply to input files, not to arrays; "
                         "drop them")
    X = local_rows(inputs)
    X = sp.csr_matrix(X) if sp.issparse(X) else np.asarray(X)
    n = X.shape[0]
    y = None if labels is None else np.asarray(local_rows(labels, name="labels"))
    row_ids = (np.arange(n, dtype=np.int64) if ids is None
               else np.asarray(local_rows(ids, name="ids"), np.int64)) + int(id_offset)
    if rows is not None:
        lo, hi = rows
        if not 0 <= lo < hi <= n:
            raise InputError(f"rows=({lo}, {hi}) is outside the {n} rows; give (start, stop) "
                             f"with 0 <= start < stop <= {n}")
        X = X[lo:hi]
        y = None if y is None else y[lo:hi]
        row_ids = row_ids[lo:hi]
    ds = write_dataset(out, X, y, ids=row_ids, shard_rows=shards, overwrite=overwrite)
    summary = ds.summary()
    return summary


def learn(data: PathLike, out: PathLike, *, overwrite: bool = False,
          **options: Any) -> dict[str, Any]:
    """Learn a metric from a labelled dataset and write the model (``lshdist learn``).

    ITML (explicit for dense data, kernelized for sparse) with constraints drawn from the
    labels, on the driver; the learned metric is kept only if it beats the prior on held-out
    rows (``force_learned`` keeps it anyway).

    Parameters
    ----------
    data : path
        A labelled dataset (`ingest`).
    out : path
        The model directory to write (atomically).
    overwrite : bool
        Replace an existing model at ``out``.
    **options
        Fields of `lshdist.config.LearnConfig` (``kind``, ``constraints``, ``gamma``,
        ``seed``, ...; the options of ``lshdist learn --help``, with underscores).

    Returns
    -------
    dict
        ``path``, ``checksum``, ``rows`` (of the dataset), ``seconds`` and ``params`` (what
        model.json records: the kind, the setting selected and the held-out accuracies).
    """
    from lshdist.jobs.learn import learn as learn_metric
    from lshdist.store.atomic import check_output
    from lshdist.store.dataset import Dataset
    from lshdist.store.model import save_model

    (cfg,) = _split_options(options, "learn()", LearnConfig)
    assert isinstance(cfg, LearnConfig)
    check_output(out, overwrite, kind="lshdist-model", inputs=(data,))
    ds = Dataset(data)
    metric, params, secs = learn_metric(ds, cfg)
    checksum = save_model(out, metric, params=params, seed=cfg.seed, overwrite=overwrite)
    return {"path": str(out), "checksum": checksum, "rows": ds.n, "seconds": secs,
            "params": params}


def build_index(data: PathLike, model: PathLike, out: PathLike, *, client: Any = None,
                append: bool = False, overwrite: bool = False, batch: str | None = None,
                **options: Any) -> dict[str, Any]:
    """Hash a dataset with a model's hash functions and build its index (``lshdist index``).

    Parameters
    ----------
    data : path
        The dataset to index.
    model : path
        The model (`learn`) whose hash functions and metric the index uses.
    out : path
        The index directory (written aside and renamed into place when complete).
    client : distributed.Client, optional
        Run on this client's cluster and start nothing; default: start a LocalCluster (or
        what the cluster options say) for the call, as the command line does.
    append : bool
        Add segments for ``data`` to the existing index (same model and parameters).
    overwrite : bool
        Replace an existing index at ``out``.
    batch : str, optional
        A label of this data (e.g. a day): an append whose label the index has already adds
        nothing.
    **options
        Fields of `lshdist.config.IndexConfig` (``target_recall``, ``k``, ``bits``,
        ``permutations``, ``segment_rows``, ``method``, ``family``, ...) and, without
        ``client``, of `lshdist.config.ClusterConfig` (``workers``, ``scheduler``, ...);
        ``stall_timeout`` applies with a client too.

    Returns
    -------
    dict
        The index manifest (rows, segments, the operating point and the calibration); with
        ``skipped: True`` when the batch was in the index already.
    """
    cfg, cluster = _split_options(options, "build_index()", IndexConfig, ClusterConfig)
    assert isinstance(cfg, IndexConfig) and isinstance(cluster, ClusterConfig)
    _check_client(client, cluster, "build_index()")
    stall = cluster.stall_timeout
    from lshdist.cluster import driver, kinds

    kind = kinds.for_build(cfg)
    plan = kind.plan_build(data=str(data), model=str(model), out=str(out), cfg=cfg,
                           overwrite=overwrite, append=append, batch=batch)
    if not plan.skipped:  # (checked again under the index lock)
        manifest = _on_cluster(client, cluster, lambda c: driver.build(
            c, kind, plan, stall=stall, hold=None).to_json())
    else:
        manifest = plan.manifest.to_json()
    return {**manifest, "skipped": plan.skipped} if plan.skipped else manifest


def query_index(index: PathLike, queries: PathLike, out: PathLike, *,
                k: int = QueryConfig.k, client: Any = None, overwrite: bool = False,
                **options: Any) -> dict[str, Any]:
    """Answer every row of a query dataset against an index (``lshdist query``); the results
    go to Parquet parts under ``out`` (`read_results` reads them).

    Parameters
    ----------
    index : path
        An index (`build_index`).
    queries : path
        A dataset of query rows (`ingest`); the results name them by its ids.
    out : path
        The results directory (written aside and renamed into place when complete).
    k : int
        Neighbours per query.
    client : distributed.Client, optional
        Run on this client's cluster and start nothing; default: start a LocalCluster (or
        what the cluster options say) for the call, as the command line does.
    overwrite : bool
        Replace existing results at ``out``.
    **options
        Fields of `lshdist.config.QueryConfig` (``mode``, ``target_recall``,
        ``check_recall``, ``query_chunk``, ...) and, without ``client``, of
        `lshdist.config.ClusterConfig`.

    Returns
    -------
    dict
        ``queries``, ``segments``, ``out``, ``mode`` (how the queries were answered), the
        ``operating_point`` and, where measured, ``measured_recall``.
    """
    qcfg, cluster = _split_options({**options, "k": k}, "query_index()", QueryConfig,
                                   ClusterConfig)
    assert isinstance(qcfg, QueryConfig) and isinstance(cluster, ClusterConfig)
    _check_client(client, cluster, "query_index()")
    stall = cluster.stall_timeout
    from lshdist.cluster import driver, kinds

    kind = kinds.for_index(str(index))
    plan = kind.plan_query(index=str(index), source=str(queries), out=str(out), cfg=qcfg,
                           overwrite=overwrite)
    return _on_cluster(client, cluster, lambda c: driver.query(c, kind, plan, stall=stall))


def read_results(path: PathLike) -> Any:
    """A query job's results as a pandas DataFrame (pandas must be installed).

    Parameters
    ----------
    path : path
        A results directory (`query_index`, ``lshdist query``), verified as it is read.

    Returns
    -------
    pandas.DataFrame
        One row per neighbour found: ``query_id`` (int64), ``rank`` (int32, 0 nearest),
        ``neighbor_id`` (int64), ``distance`` (float32, the learned squared distance), in the
        parts' query order and ascending rank.

    Raises
    ------
    ImportError
        Without pandas.
    InputError, FormatError
        For a missing or damaged results directory.
    """
    import importlib.util

    try:  # pyarrow's to_pandas imports it
        has_pandas = importlib.util.find_spec("pandas") is not None
    except ValueError:  # a module stubbed out in sys.modules
        has_pandas = False
    if not has_pandas:
        raise ImportError("lshdist.read_results returns a pandas DataFrame, and pandas is not "
                          "installed: pip install pandas")
    import pyarrow as pa

    from lshdist.store.results import NEIGHBORS_SCHEMA, iter_parts

    tables = []
    for qids, nb, dist, _ in iter_parts(path):
        q, k = nb.shape
        found = (nb >= 0).ravel()
        tables.append(pa.table({
            "query_id": np.repeat(qids.astype(np.int64), k)[found],
            "rank": np.tile(np.arange(k, dtype=np.int32), q)[found],
            "neighbor_id": nb.ravel()[found],
            "distance": dist.ravel().astype(np.float32)[found],
        }, schema=NEIGHBORS_SCHEMA))
    table = pa.concat_tables(tables) if tables else NEIGHBORS_SCHEMA.empty_table()
    return table.to_pandas()
