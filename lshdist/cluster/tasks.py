"""Task functions run on Dask workers: module-level, picklable, over paths and arrays."""

from __future__ import annotations

import numpy as np

from lshdist.index.permutation import PermutationIndex
from lshdist.index.searcher import encode, permutation_seed
from lshdist.index.scan import scan_topk
from lshdist.store.dataset import Dataset
from lshdist.store.index import read_segment, write_segment


def load_family(model_path: str, bits: int, seed: int, learned: bool):
    """The hash family of a model (learned, or Charikar's baseline carrying the metric)."""
    from lshdist.hashing.families import family_for
    from lshdist.store.model import load_model

    metric, _ = load_model(model_path)
    return family_for(metric, bits=bits, seed=seed, learned=learned)


def build_segment(data_path: str, start: int, stop: int, family, params: dict,
                  index_dir: str, name: str) -> dict:
    """Encode rows ``start:stop`` with the broadcast hash family, build and write a segment."""
    ds = Dataset(data_path)
    X = ds.read_rows(start, stop)
    ids = ds.ids()[start:stop]
    codes, payload = encode(family.metric, family, X)
    index = PermutationIndex(
        n_permutations=params["permutations"], epsilon=params["epsilon"], window=params["window"],
        hamming_keep=params["hamming_keep"], seed=permutation_seed(params["seed"]),
    ).fit(codes, family.bits, payload, ids)
    entry = write_segment(index_dir, name, index)
    entry.update(source=str(data_path), start=int(start), stop=int(stop))
    return entry


def load_segment(index_dir: str, entry: dict, manifest: dict) -> PermutationIndex:
    return read_segment(index_dir, entry, manifest)


def encode_queries(queries_path: str, start: int, stop: int, family):
    ds = Dataset(queries_path)
    X = ds.read_rows(start, stop)
    codes, payload = encode(family.metric, family, X, query=True)
    return codes, payload, ds.ids()[start:stop]


def search_segment(segment: PermutationIndex, encoded, k: int, mode: str):
    """Partial top-k of one query chunk against one segment: (dist, ids, candidates)."""
    codes, payload, _ = encoded
    if mode == "scan":
        dist, ids = scan_topk(segment.payload_, payload, k, ids=segment.ids_)
        cand = np.full(len(ids), len(segment), np.int64)
    else:
        dist, ids, stats = segment.search(codes, payload, k)
        cand = stats["reranked"]
    return dist, ids, cand


def merge_topk(parts, k: int):
    """Global top-k from per-segment top-k lists: ascending distance, ties by id."""
    dist = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    key_missing = ids < 0
    dist = np.where(key_missing, np.inf, dist)
    order = np.lexsort((np.where(key_missing, np.iinfo(np.int64).max, ids), dist), axis=1)[:, :k]
    return (np.take_along_axis(dist, order, 1).astype(np.float32),
            np.take_along_axis(ids, order, 1))


def merge_and_write(encoded, parts, k: int, out_dir: str, chunk: int) -> int:
    """Merge the partial lists of one query chunk and write its Parquet parts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    qids = encoded[2]
    dist, ids = merge_topk(parts, k)
    cand = np.sum([p[2] for p in parts], axis=0)
    Q, kk = ids.shape
    keep = (ids >= 0).ravel()
    table = pa.table({
        "query_id": pa.array(np.repeat(qids, kk)[keep], pa.int64()),
        "rank": pa.array(np.tile(np.arange(kk, dtype=np.int32), Q)[keep], pa.int32()),
        "neighbor_id": pa.array(ids.ravel()[keep], pa.int64()),
        "distance": pa.array(dist.ravel()[keep], pa.float32()),
    })
    pq.write_table(table, f"{out_dir}/neighbors/part-{chunk:05d}.parquet")
    stats = pa.table({"query_id": pa.array(qids, pa.int64()),
                      "candidates": pa.array(cand.astype(np.int32), pa.int32())})
    pq.write_table(stats, f"{out_dir}/stats/part-{chunk:05d}.parquet")
    return int(Q)
