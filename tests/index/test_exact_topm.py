"""The exact top m of the calibration's truth (`lshdist.index.calibrate.exact_truth`) and of the
scan (`lshdist.index.scan.scan_topk`) pinned on real data against numpy references: the ids
exactly, ties by id, and the distances the re-rank computes (float32, summed in row order).

References: integer-valued payloads (Fashion-MNIST pixels, Letter's features, or either
under a metric whose ``G`` is an integer matrix) have exact distances in float64, and in the
re-rank's float32 too while they stay below 2^24 (checked); real-valued payloads are compared
with the re-rank's own distance over every row (`rerank_dense`, itself checked against
float64 within its rounding).
"""

import numpy as np
import pytest

from lshdist._kernels.search import rerank_dense
from lshdist.index.calibrate import BULK_QUERIES, exact_truth
from lshdist.index.metric_payload import make_payload
from lshdist.index.payload import U32, DensePayload, gamma
from lshdist.index.scan import scan_topk
from lshdist.metric.learned import ExplicitMetric, ImplicitMetric


def _topm(D: np.ndarray, ids: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``D`` (Q, N), the m smallest by (distance, id)."""
    out_d = np.empty((len(D), m), D.dtype)
    out_i = np.empty((len(D), m), np.int64)
    for q, row in enumerate(D):
        kth = np.partition(row, m - 1)[m - 1]
        cand = np.flatnonzero(row <= kth)
        order = cand[np.lexsort((ids[cand], row[cand]))][:m]
        out_d[q], out_i[q] = row[order], ids[order]
    return out_d, out_i


def integer_reference(Z: np.ndarray, Zq: np.ndarray, ids: np.ndarray, m: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Exact top m of integer-valued rows: float64 products of integers below 2^53 are exact,
    and so is the re-rank's float32 sum of the top m while they stay below 2^24."""
    assert np.array_equal(Z, np.round(Z)) and np.array_equal(Zq, np.round(Zq))
    A, B = Z.astype(np.float64), Zq.astype(np.float64)
    D = (B * B).sum(1)[:, None] + (A * A).sum(1)[None, :] - 2.0 * (B @ A.T)
    d, i = _topm(D, ids, m)
    assert d.max() < 2.0 ** 23, "distances too large for the float32 sum to be exact"
    return d.astype(np.float32), i


def rerank_reference(Z: np.ndarray, Zq: np.ndarray, ids: np.ndarray, m: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The re-rank's top m with every row a candidate (`rerank_dense`: its float32 distance,
    ties by id) — the definition of the scan's answer, with no product to pick candidates —
    checked against float64: each reported distance within the float32 sum's rounding of
    its float64 value, and no row whose float64 distance is clearly below the m-th left out."""
    Q, N = len(Zq), len(Z)
    offsets = np.arange(Q + 1, dtype=np.int64) * N
    rows = np.tile(np.arange(N, dtype=np.int64), Q)
    d, r = rerank_dense(offsets, rows, Z, Zq, m, ids)
    tol = 2 * gamma(Z.shape[1] + 2, U32)
    D64 = np.stack([((Z.astype(np.float64) - q) ** 2).sum(1) for q in Zq.astype(np.float64)])
    np.testing.assert_allclose(d, np.take_along_axis(D64, r, 1), rtol=tol)
    kth = np.partition(D64, m - 1, axis=1)[:, m - 1]
    assert np.all(d[:, -1] <= kth * (1 + tol))
    return d, ids[r]


def shuffled_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.permutation(10**7)[:n].astype(np.int64)  # ids that do not rise with rows


def check(payload, qpayload, ids, m, ref, batch=None):
    """exact_truth and the full scan give ``ref`` exactly; the pruned scan too."""
    D, I, spq = exact_truth(payload, qpayload, m, ids=ids, batch=batch)
    np.testing.assert_array_equal(I, ref[1])
    np.testing.assert_array_equal(D, ref[0])
    assert spq > 0
    for prune in (False, True):
        d, i = scan_topk(payload, qpayload, m, ids=ids, prune=prune)
        np.testing.assert_array_equal(i, ref[1])
        np.testing.assert_array_equal(d, ref[0])


@pytest.mark.parametrize("n_queries,batch", [(150, None), (260, BULK_QUERIES),
                                             (700, None), (700, BULK_QUERIES)])
def test_fashion_pixels_exact_top_m(fashion, n_queries, batch):
    # 700 queries x 6,000 rows prune (the truth's path at 1,000 calibration queries); 150 and
    # 260 do not.  Bugs caught: a timed slice's answer dropped or put at another query's row,
    # the last slice lost, ids mapped twice or not at all.
    Xtr, _, Xte, _ = fashion
    rng = np.random.default_rng(0)
    Z = np.asarray(Xtr[rng.choice(len(Xtr), 6_000, replace=False)], np.float32)
    Zq = np.asarray(Xte[rng.choice(len(Xte), n_queries, replace=False)], np.float32)
    ids = shuffled_ids(rng, len(Z))
    check(DensePayload(Z), DensePayload(Zq), ids, 11, integer_reference(Z, Zq, ids, 11),
          batch)


def test_fashion_under_an_integer_explicit_metric(fashion):
    # A = G^T G with G a random integer matrix: the payload Gx is integer-valued, and far
    # from the origin against its spread (its product form cancels more)
    Xtr, _, Xte, _ = fashion
    rng = np.random.default_rng(1)
    d = 784
    G = np.eye(d) + np.triu(rng.integers(0, 2, size=(d, d)), 1) * (rng.random((d, d)) < 0.01)
    metric = ExplicitMetric(G.T @ G)
    Z = (np.asarray(Xtr[:2_000], np.float64) // 32) @ G.T  # exact in float32 (< 2^24)
    Zq = (np.asarray(Xte[:420], np.float64) // 32) @ G.T
    assert np.allclose(metric.transform(Xtr[:2]), np.asarray(Xtr[:2], np.float64) @ metric.G.T,
                       rtol=1e-4)
    Z, Zq = Z.astype(np.float32), Zq.astype(np.float32)
    ids = shuffled_ids(rng, len(Z))
    check(DensePayload(Z), DensePayload(Zq), ids, 11, integer_reference(Z, Zq, ids, 11),
          BULK_QUERIES)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_letter_under_a_real_valued_explicit_metric(letter, offset):
    # a real-valued learned-like metric (A = G^T G, G dense and asymmetric): distances rounded
    # in float32, compared with the re-rank of every row
    Xtr, _, Xte, _ = letter
    rng = np.random.default_rng(2)
    G = np.eye(16) + 0.3 * rng.standard_normal((16, 16))
    metric = ExplicitMetric(G.T @ G)
    Z = metric.transform(Xtr[:5_000]) + np.float32(offset)
    Zq = metric.transform(Xte[:330]) + np.float32(offset)
    ids = shuffled_ids(rng, len(Z))
    check(DensePayload(Z), DensePayload(Zq), ids, 11, rerank_reference(Z, Zq, ids, 11),
          BULK_QUERIES)


def test_near_duplicate_rows(fashion):
    # groups of rows a few float32 ulps apart (and exact copies): their product-form scores
    # cancel to the same float32 value, only the re-rank's sums tell them apart — no
    # true neighbour may be dropped by the product's rounding (bugs caught: a slack too small
    # for the cancellation; candidates cut at m instead of every row within the bound)
    Xtr, _, _, _ = fashion
    rng = np.random.default_rng(3)
    base = np.asarray(Xtr[:200], np.float32) / np.float32(255.0)
    rows = [base]
    for _ in range(9):
        noise = rng.integers(-2, 3, size=base.shape).astype(np.float32)
        rows.append(base * (1.0 + noise * np.float32(2.0 ** -22)))
    Z = np.ascontiguousarray(np.concatenate(rows)[rng.permutation(2_000)])
    Zq = np.ascontiguousarray(Z[rng.choice(len(Z), 300, replace=False)]
                              + rng.integers(-1, 2, size=(300, 784)).astype(np.float32) * 1e-7)
    ids = shuffled_ids(rng, len(Z))
    ref = rerank_reference(Z, Zq, ids, 15)
    # the data are hard: each query's copies (at least 9 of its 15 neighbours) lie closer to it
    # than the float32 product can resolve (~1e-7 ||q||^2)
    scale = (Zq.astype(np.float64) ** 2).sum(1)[:, None]
    assert np.all((ref[0] < 1e-9 * scale).sum(1) >= 9)
    check(DensePayload(Z), DensePayload(Zq), ids, 15, ref, BULK_QUERIES)


def test_implicit_sparse_payload_exact_top_m(letter):
    # the implicit metric's sparse payload (identity kernel: L2 on Letter's integer features)
    # takes the same exact_truth: the same top m as the integer reference, ties by id
    Xtr, _, Xte, _ = letter
    rng = np.random.default_rng(4)
    X = np.asarray(Xtr[:4_000], np.float32)
    Xq = np.asarray(Xte[:260], np.float32)
    metric = ImplicitMetric.identity(X[:5], d=16)
    ids = shuffled_ids(rng, len(X))
    check(make_payload(metric, X), make_payload(metric, Xq, query=True), ids, 11,
          integer_reference(X, Xq, ids, 11), BULK_QUERIES)


def _fashion_segment(Xtr: np.ndarray, rows: int, rng: np.random.Generator, lists: int
                     ) -> tuple[np.ndarray, object, object]:
    """A fitted segment of ``rows`` Fashion-MNIST training rows (float32) under the identity
    metric about their mean, 64-bit keys, shuffled ids: the rows, the family, the segment."""
    from lshdist.index.permutation import PermutationIndex
    from lshdist.index.searcher import MetricIndex, encode

    X = np.asarray(Xtr[rng.choice(len(Xtr), rows, replace=False)], np.float32)
    metric = ExplicitMetric.identity(784, center=X.mean(0))
    family = MetricIndex(metric, bits=64).fit(X[:5]).family_
    codes, payload = encode(metric, family, X)
    seg = PermutationIndex(n_permutations=lists, seed=1).fit(codes, family.bits, payload,
                                                             shuffled_ids(rng, len(X)))
    return X, family, seg


def test_a_segment_not_timed_gives_the_same_neighbours(fashion):
    # `segment_neighbours(time_scan=False)`: the segments whose scan the calibration does not
    # time skip the timed share of the truth -- the same neighbours, no seconds
    from lshdist.cluster.tasks import segment_neighbours

    Xtr, _, Xte, _ = fashion
    X, family, seg = _fashion_segment(Xtr, 2_000, np.random.default_rng(5), 8)
    sample = (np.asarray(Xte[:200], np.float32), None)
    timed = segment_neighbours(seg, sample, family, 10)
    untimed = segment_neighbours(seg, sample, family, 10, time_scan=False)
    assert timed.parts[0][3] > 0 and untimed.parts[0][3] is None
    for a, b in zip(timed.parts[0][:3], untimed.parts[0][:3]):
        np.testing.assert_array_equal(a, b)
    ref = integer_reference(X, sample[0], seg.ids_, 11)
    np.testing.assert_array_equal(untimed.parts[0][1], ref[1])
    np.testing.assert_array_equal(untimed.parts[0][0], ref[0])


@pytest.mark.parametrize("rows", [2_000, 6])
def test_a_recall_checks_truth_found_with_the_calibrations(fashion, rows):
    # `segment_neighbours(check=...)`: a recall check's sample scanned with the calibration
    # sample (the part not timed) or apart (the timed one) -- its exact top k as
    # `check_truth` finds it, the calibration's neighbours unchanged; on a part of fewer rows
    # than k too (ids -1, distances inf past its end)
    from lshdist.cluster.tasks import check_truth, segment_neighbours

    Xtr, _, Xte, _ = fashion
    X, family, seg = _fashion_segment(Xtr, rows, np.random.default_rng(7), 4)
    sample = (np.asarray(Xte[:200], np.float32), None)
    check = (np.asarray(Xte[500:650], np.float32), np.arange(500, 650))
    if rows > 10:
        ref = integer_reference(X, check[0], seg.ids_, 10)
    else:  # (every row, by its float64 distance: too far apart for an exact float32 sum)
        D64 = ((check[0][:, None, :].astype(np.float64) - X[None]) ** 2).sum(-1)
        order = np.argsort(D64, axis=1, kind="stable")
        ref = (np.take_along_axis(D64, order, 1), seg.ids_[order])
    for timed in (True, False):
        alone = segment_neighbours(seg, sample, family, 10, timed)
        both = segment_neighbours(seg, sample, family, 10, timed, check, 10)
        for a, b in zip(both.parts[0][:3], alone.parts[0][:3]):
            np.testing.assert_array_equal(a, b)
        assert both.check is not None
        for a, b in zip(both.check, check_truth(seg, check, family, 10)):
            np.testing.assert_array_equal(a, b)
        assert both.check[0].shape == (150, 10) and np.all(both.check[2] == rows)
        np.testing.assert_array_equal(both.check[1][:, :rows], ref[1])
        if rows > 10:
            np.testing.assert_array_equal(both.check[0][:, :rows], ref[0])
        else:
            np.testing.assert_allclose(both.check[0][:, :rows], ref[0], rtol=1e-6)
            assert np.all(np.isinf(both.check[0][:, rows:]))
        assert np.all(both.check[1][:, rows:] == -1)
