"""Rows with NaN or infinity are refused where they enter a search (`encode`, the hyperplane
and subspace indexes), naming the row and column: before, a NaN row made the scan's centre NaN
and the message blamed an overflow of row 0, and a query with a NaN or an infinite entry was
answered (or refused as an overflow)."""

import numpy as np
import pytest
import scipy.sparse as sp

from lshdist.blocks import SparseBlock
from lshdist.errors import InputError
from lshdist.index.searcher import MetricIndex
from lshdist.metric.learned import ExplicitMetric
from lshdist.validation import check_finite


def test_check_finite_names_the_first_bad_entry():
    X = np.zeros((20_000, 4), np.float32)
    check_finite(X)
    check_finite(np.full((5, 3), 3e38, np.float32))  # finite, though row sums overflow float32
    X[17_000, 2], X[9_000, 1], X[9_000, 3] = np.inf, np.nan, -np.inf  # in two row blocks
    with pytest.raises(InputError, match=r"X holds 3 NaN or infinite values \(first in row "
                                         r"9000, column 1\).*remove or impute"):
        check_finite(X)
    S = sp.csr_matrix(np.array([[0, 1.0, 0], [0, 0, np.nan]], np.float32))
    with pytest.raises(InputError, match=r"holds 1 .*first in row 1, column 2"):
        check_finite(S)
    B = SparseBlock.from_arrays([0, 1, 2], np.array([7, 10**12], np.uint64), [1.0, np.inf])
    with pytest.raises(InputError, match=r"first in row 1, column 1000000000000"):
        check_finite(B)  # a sparse block's column: the feature id


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_rows_and_queries_are_refused(bad):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 8)).astype(np.float32)
    X2 = X.copy()
    X2[5, 3] = bad
    with pytest.raises(InputError, match=r"the rows \(X\) holds 1 .*first in row 5, column 3"):
        MetricIndex(ExplicitMetric.identity(8), seed=0).fit(X2)
    ix = MetricIndex(ExplicitMetric.identity(8), seed=0).fit(X)
    Q = X[:4].copy()
    Q[2, 6] = bad
    for mode in ("scan", "hash"):
        with pytest.raises(InputError,
                           match=r"the queries \(Xq\) holds 1 .*first in row 2, column 6"):
            ix.query(Q, 3, mode=mode)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_nonfinite_hyperplanes_and_subspace_rows_are_refused():
    from lshdist.index.hyperplane import HyperplaneIndex
    from lshdist.index.subspace import SubspaceIndex

    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 6)).astype(np.float32)
    ix = HyperplaneIndex(bits=64, seed=0).fit(X)
    W = rng.normal(size=(3, 6))
    W[1, 4] = np.nan
    with pytest.raises(InputError, match=r"hyperplane normals holds 1 .*row 1, column 4"):
        ix.query(W, 3)
    X[7, 0] = np.inf
    with pytest.raises(InputError, match=r"points holds 1 .*row 7, column 0"):
        HyperplaneIndex(bits=64, seed=0).fit(X)
    big = ExplicitMetric(np.eye(6) * 1e60)  # finite rows, transformed beyond float32
    with pytest.raises(InputError, match=r"model's space\) holds .*NaN or infinite"):
        SubspaceIndex(metric=big, rank=2).fit(rng.normal(size=(400, 6)) * 1e10)
