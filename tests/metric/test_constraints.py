"""Neighbour constraints: the anchors' neighbours (scan or distance matrix, ties by row) and the
table shared by a grid's fits, which never changes the pairs."""

import numpy as np
import pytest

from lshdist.errors import InputError
from lshdist.metric.constraints import NeighborTable, anchor_neighbors, neighbor_pairs
from lshdist.metric.itml import ITML
from lshdist.metric.learned import sq_euclidean


def _reference(Z: np.ndarray, anchors: np.ndarray, k: int) -> np.ndarray:
    """Each anchor's k nearest other rows by (float64 squared distance, row): numpy only."""
    Z64 = Z.astype(np.float64)
    out = []
    for a in anchors:
        d = ((Z64 - Z64[a]) ** 2).sum(axis=1)
        d[a] = np.inf
        out.append(np.lexsort((np.arange(len(Z)), d))[:k])
    return np.array(out)


def _rows_with_duplicates(seed: int = 0) -> np.ndarray:
    """Integer-valued rows (many ties) and 5 copies of row 0 placed before and after it."""
    rng = np.random.default_rng(seed)
    Z = rng.integers(0, 3, size=(400, 6)).astype(np.float32)
    Z[[1, 2, 150, 151, 399]] = Z[0]
    return Z


@pytest.mark.parametrize("k", [1, 3, 10])
def test_anchor_neighbors_scan_and_matrix_match_the_reference(k):
    """The scan route (float32 rows) and the matrix route (float64 rows) both give the k
    nearest other rows ordered by (distance, row), the anchor itself never among them — also
    where k + 1 rows tie it at distance 0 (anchor 399 has 5 earlier copies)."""
    Z = _rows_with_duplicates()
    anchors = np.array([399, 0, 151, 7, 250, 42], np.int64)
    ref = _reference(Z, anchors, k)
    scan = anchor_neighbors(Z, anchors, k, sq_euclidean)
    matrix = anchor_neighbors(Z.astype(np.float64), anchors, k, sq_euclidean)
    np.testing.assert_array_equal(scan, ref)
    np.testing.assert_array_equal(matrix, ref)
    assert not (scan == anchors[:, None]).any()


def test_anchor_neighbors_threaded_scan_blocks_at_40_columns():
    """More than one 1,024-query block on two threads, 40 columns (the scan's uint8 payload),
    rows in pairs of duplicates: the reference's order, ties by row."""
    rng = np.random.default_rng(8)
    Z = rng.integers(0, 4, size=(1500, 40)).astype(np.float32)
    Z[750:] = Z[:750]
    anchors = rng.permutation(1500)[:1100]
    got = anchor_neighbors(Z, anchors, 7, sq_euclidean, n_threads=2)
    np.testing.assert_array_equal(got, _reference(Z, anchors, 7))


def test_a_table_gives_the_same_pairs_and_is_used_only_for_its_anchors(monkeypatch):
    """Pairs drawn with a table equal those drawn without, for every neighbours-per-anchor the
    table covers; a table for another seed (other anchors) or too few neighbours is not used
    (the pairs are still the table-less ones), and a covering table spares the computation."""
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(600, 5)).astype(np.float32)
    y = rng.integers(0, 4, size=600)
    est = ITML(n_constraints=300, seed=11)
    table = est.neighbor_table(Z, [5, 10, 20])
    assert table.nn.shape == (60, 20)  # 300 pairs / 5 per anchor, 20 neighbours each
    for k in (5, 10, 20):
        want = neighbor_pairs(Z, y, 300, k, np.random.default_rng(11), sq_euclidean)
        got = neighbor_pairs(Z, y, 300, k, np.random.default_rng(11), sq_euclidean, table)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])

    import lshdist.metric.constraints as C

    other = ITML(n_constraints=300, seed=12).neighbor_table(Z, [10])
    short = NeighborTable(table.anchors, table.nn[:, :3], table.n, table.digest)
    calls = []
    real = C.anchor_neighbors
    monkeypatch.setattr(C, "anchor_neighbors", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    neighbor_pairs(Z, y, 300, 10, np.random.default_rng(11), sq_euclidean, table)
    assert calls == []  # covered: nothing recomputed
    for bad in (other, short):
        got = neighbor_pairs(Z, y, 300, 10, np.random.default_rng(11), sq_euclidean, bad)
        want = neighbor_pairs(Z, y, 300, 10, np.random.default_rng(11), sq_euclidean)
        np.testing.assert_array_equal(got[0], want[0])
    assert len(calls) == 4  # each refused table: the neighbours computed again


def test_fit_with_a_table_learns_the_same_matrix_without_searching(monkeypatch):
    """A fit given its table learns the table-less fit's matrix and searches no neighbours; a
    table made on other rows of the same shape (another X, or another prior) is refused — the
    fit then searches its own, and still learns its own matrix."""
    import lshdist.metric.constraints as C

    rng = np.random.default_rng(5)
    X = rng.normal(size=(500, 40)).astype(np.float32)  # 40 columns: the scan's uint8 re-rank
    y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0)
    est = ITML(n_constraints=400, max_iter=5, seed=2)
    a = ITML(n_constraints=400, max_iter=5, seed=2).fit(X, y).A_
    table = est.neighbor_table(X, [10, 5])
    others = [est.neighbor_table(X[::-1].copy(), [10, 5]),
              ITML(n_constraints=400, max_iter=5, seed=2,
                   prior="inverse-covariance").neighbor_table(X, [10, 5])]
    calls: list[int] = []
    real = C.anchor_neighbors
    monkeypatch.setattr(C, "anchor_neighbors", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    b = est.fit(X, y, neighbors=table).A_
    np.testing.assert_array_equal(a, b)
    assert calls == []
    for other in others:
        np.testing.assert_array_equal(est.fit(X, y, neighbors=other).A_, a)
    assert len(calls) == 2
    with pytest.raises(InputError, match="neighbours per anchor"):
        est.neighbor_table(X, [])
