"""The results format: written and read back by query id, whatever the ids' order."""

import numpy as np
import pytest

from lshdist.errors import FormatError, OutputExistsError
from lshdist.store.results import read_meta, read_results, write_part, write_results


def _write(path, parts, k):
    with write_results(path, k=k) as tmp:
        for c, (qids, dist, ids, cand) in enumerate(parts):
            write_part(tmp, c, qids, dist, ids, cand)


def test_unsorted_noncontiguous_query_ids_read_back_by_id(tmp_path):
    # catches: matching part rows to queries by position or by searchsorted on unsorted ids
    # (ids [5, 3, 9]: query 5 got query 3's neighbours, query 3 none)
    qids = np.array([5, 3, 9], np.int64)
    ids = np.array([[50, 51], [30, -1], [90, 91]], np.int64)  # query 3 has one neighbour
    dist = np.array([[0.5, 0.6], [0.3, np.inf], [0.9, 1.0]], np.float32)
    cand = np.array([7, 4, 8])
    _write(tmp_path / "r", [(qids, dist, ids, cand)], k=2)
    got_q, got_nb, got_d, got_c = read_results(tmp_path / "r")
    assert got_q.tolist() == [5, 3, 9]
    assert got_nb.tolist() == ids.tolist() and got_c.tolist() == [7, 4, 8]
    assert np.array_equal(got_d, dist)
    # in a requested order, across parts
    _write(tmp_path / "s", [(qids[:2], dist[:2], ids[:2], cand[:2]),
                            (qids[2:], dist[2:], ids[2:], cand[2:])], k=2)
    q, nb, _, c = read_results(tmp_path / "s", np.array([9, 5, 3]))
    assert q.tolist() == [9, 5, 3] and nb[:, 0].tolist() == [90, 50, 30]
    assert c.tolist() == [8, 7, 4]
    assert read_meta(tmp_path / "s").queries == 3
    with pytest.raises(FormatError, match="holds no row for id 4"):
        read_results(tmp_path / "s", np.array([9, 4]))


def test_results_refuse_what_they_are_not(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(FormatError, match="not an lshdist results directory"):
        read_results(tmp_path / "plain")
    (tmp_path / "plain" / "keep.txt").write_text("user data")
    with pytest.raises(OutputExistsError, match="not an lshdist artefact"), \
            write_results(tmp_path / "plain", k=1, overwrite=True):
        pass
    assert (tmp_path / "plain" / "keep.txt").read_text() == "user data"


def test_failed_write_leaves_nothing_and_keeps_previous(tmp_path):
    qids = np.array([2, 1], np.int64)
    _write(tmp_path / "r", [(qids, np.zeros((2, 1), np.float32), np.array([[7], [8]]),
                             np.ones(2))], k=1)
    with pytest.raises(RuntimeError), write_results(tmp_path / "r", k=1, overwrite=True) as tmp:
        write_part(tmp, 0, qids, np.zeros((2, 1), np.float32), np.array([[0], [0]]), np.ones(2))
        raise RuntimeError("killed")
    assert read_results(tmp_path / "r")[1][:, 0].tolist() == [7, 8]
    assert [p.name for p in tmp_path.iterdir()] == ["r"]


def test_a_chunk_merged_and_written_in_row_groups_equals_it_merged_whole(tmp_path, monkeypatch):
    # merge_and_write merges two segments' partial top-k and writes a row group of queries at
    # a time (bounded memory); the parts must hold what one whole merge gives, in order, with
    # missing neighbours dropped and candidates summed
    import pyarrow.parquet as pq

    import lshdist.store.results as res
    from lshdist.cluster.answers import merge_and_write
    from lshdist.index.permutation import merge_topk

    rng = np.random.default_rng(0)
    Q, k = 23, 4
    parts = []
    for s in range(2):
        d = np.sort(rng.random((Q, k)).astype(np.float32), axis=1)
        i = rng.permutation(1000)[: Q * k].reshape(Q, k) + 1000 * s
        i[rng.random((Q, k)) < 0.2] = -1  # a missing neighbour: distance inf, id -1
        d[i < 0] = np.inf
        parts.append((d, i.astype(np.int64), rng.integers(0, 50, Q)))
    qids = np.arange(500, 500 + Q, dtype=np.int64)
    monkeypatch.setattr(res, "GROUP_ROWS", 20)  # 5 queries a row group: 5 groups, one short
    assert res.queries_per_group(k) == 5
    with write_results(tmp_path / "r", k=k) as tmp:
        assert merge_and_write((None, None, qids), parts, k, str(tmp), 0) == Q
    assert pq.ParquetFile(tmp_path / "r" / "neighbors" / "part-00000.parquet").num_row_groups == 5
    dist, ids = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
    got_q, got_nb, got_d, got_c = read_results(tmp_path / "r")
    assert got_q.tolist() == qids.tolist() and np.array_equal(got_nb, ids)
    assert np.array_equal(got_d, dist) and got_c.tolist() == (parts[0][2] + parts[1][2]).tolist()


def test_a_failed_chunk_leaves_no_part_file(tmp_path):
    # an exception inside PartWriter (a chunk's merge failing half-way) removes its files
    from lshdist.store.results import PartWriter

    (tmp_path / "neighbors").mkdir()
    (tmp_path / "stats").mkdir()
    qids = np.arange(3, dtype=np.int64)
    with pytest.raises(RuntimeError, match="half-way"), PartWriter(tmp_path, 7) as out:
        out.write(qids, np.zeros((3, 2), np.float32), np.ones((3, 2), np.int64), np.ones(3))
        raise RuntimeError("half-way")
    assert not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("bad", [2, -1, 3])
def test_a_rank_outside_0_to_k_minus_1_is_a_format_error(tmp_path, bad):
    """A part whose ranks reach k (or below 0) is refused as damaged, not indexed past the
    (Q, k) arrays.  Mutant caught: the check ``rank.max() >= k`` written ``> k`` (rank k then
    reached numpy as an IndexError traceback)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lshdist.store.results import NEIGHBORS_SCHEMA

    qids = np.array([4, 8], np.int64)
    _write(tmp_path / "r", [(qids, np.zeros((2, 2), np.float32), np.array([[1, 2], [3, 4]]),
                             np.ones(2))], k=2)
    part = tmp_path / "r" / "neighbors" / "part-00000.parquet"
    pq.write_table(pa.table({"query_id": [4, 4, 8], "rank": [0, 1, bad],
                             "neighbor_id": [1, 2, 3], "distance": [0.0, 0.1, 0.2]},
                            schema=NEIGHBORS_SCHEMA), part)
    with pytest.raises(FormatError, match=r"part 'part-00000.parquet' has ranks outside "
                                          r"0\.\.1; run the query again"):
        read_results(tmp_path / "r")
