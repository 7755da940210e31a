"""Operating points of a subspace index from a recall target (``--target-recall``).

The search of `lshdist.index.subspace` has two knobs: ``n_probe`` (groups searched per query)
and ``n_candidates`` (members re-ranked per probed group, nearest in Hamming distance, ties by
position).  On a sample of queries whose exact top-k is known (a scan of every group, merged by
(distance, id)), the recall of every (n_probe, n_candidates) is counted without searching:

* a true neighbour is re-ranked iff its group is probed (`probe_mask`) and its rank in that
  group's (Hamming, position) order — `hamming_ranks` — is below ``n_candidates``;
* a re-ranked true neighbour is always in the answer (the re-rank is exact and orders by
  (distance, id), the order that defined the truth), so the recall of a point is the fraction
  of true neighbours it re-ranks: equal to the real search's recall on the sample, exactly;
* its cost is the rows re-ranked per query, ``Σ_probed min(n_candidates, n_g)``.

`choose` keeps the cheapest point whose recall reaches the target by one standard error
(`lshdist.index.calibrate.recall_margin`, as the permutation index's calibration does); the grid
holds the exhaustive point (every group, every member: recall 1), so one always does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lshdist.index.calibrate import recall_margin
from lshdist.index.subspace import Group, probe_mask

#: n_candidates of the grid, as multiples of k (the group sizes are added)
CANDIDATE_FACTORS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class SubspacePoint:
    """One operating point: its recall@k on the sample and rows re-ranked per query."""

    n_probe: int
    n_candidates: int
    recall: float
    reranked: float


def hamming_ranks(grp: Group, Zqc: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rank of given members in each query's (Hamming distance, position) order of ``grp``.

    Parameters
    ----------
    grp : the group (its members are positions 0..n_g-1 of ``grp.codes``)
    Zqc : float64 (Q, d), centred queries
    positions : int64 (Q, m), member positions per query (-1: none)

    Returns
    -------
    int64 (Q, m): ranks from 0 (what `lshdist.index.subspace.group_candidates` takes first),
    -1 where ``positions`` is -1.  A member is a candidate iff its rank < n_candidates.
    """
    n_g = len(grp.codes)
    out = np.full(positions.shape, -1, np.int64)
    qcodes = grp.code(Zqc @ grp.basis)
    pos = np.arange(n_g, dtype=np.int64)
    for q in range(len(qcodes)):
        want = positions[q] >= 0
        if not want.any():
            continue
        ham = np.bitwise_count(qcodes[q][None, :] ^ grp.codes).sum(axis=1, dtype=np.int64)
        key = np.sort(ham * n_g + pos)  # unique keys: Hamming, then position (= id order)
        mine = ham[positions[q][want]] * n_g + positions[q][want]
        out[q, want] = np.searchsorted(key, mine, side="left")
    return out


def grid(route: np.ndarray, sizes: np.ndarray, k: int, truth_group: np.ndarray,
         truth_rank: np.ndarray, n_truth: int, *, probes: Sequence[int] | None = None,
         candidates: Sequence[int] | None = None) -> list[SubspacePoint]:
    """Recall and cost of every (n_probe, n_candidates) on the sample.

    Parameters
    ----------
    route : float64 (Q, G), distances of the sample queries to the subspaces
    sizes : int (G,), rows per group
    k : neighbours per query
    truth_group, truth_rank : int64 (Q, k), group and Hamming rank (`hamming_ranks`) of each
        true neighbour (-1: none, a query with fewer than k rows in the index)
    n_truth : true neighbours in all (the recall's denominator)
    probes, candidates : the axes (default 1..G and `CANDIDATE_FACTORS` × k plus the sizes)
    """
    G = len(sizes)
    ps = list(range(1, G + 1)) if probes is None else sorted(set(probes))
    hs = (sorted({f * k for f in CANDIDATE_FACTORS} | {int(s) for s in sizes})
          if candidates is None else sorted(set(candidates)))
    valid = truth_group >= 0
    tg = np.where(valid, truth_group, 0)
    out = []
    for p in ps:
        mask, _ = probe_mask(route, sizes, k, p)
        probed = np.take_along_axis(mask, tg, axis=1) & valid
        for h in hs:
            found = int((probed & (truth_rank < h)).sum())
            reranked = float((mask * np.minimum(h, sizes)[None, :]).sum(axis=1).mean())
            out.append(SubspacePoint(p, h, found / max(n_truth, 1), reranked))
    return out


def choose(points: Sequence[SubspacePoint], target: float, n_queries: int, k: int
           ) -> tuple[SubspacePoint, str]:
    """The cheapest point (fewest rows re-ranked; then fewer groups, fewer candidates) whose
    recall reaches ``target`` plus one standard error; the most accurate one if none does."""
    need = min(target + recall_margin(target, n_queries), 1.0)
    ok = [p for p in points if p.recall >= need]
    if not ok:
        best = max(points, key=lambda p: (p.recall, -p.reranked))
        return best, (f"no point reaches recall {need:.3f} on the sample; the most accurate "
                      f"(recall {best.recall:.3f})")
    best = min(ok, key=lambda p: (p.reranked, p.n_probe, p.n_candidates))
    return best, (f"the cheapest point with recall@{k} >= {need:.3f} (target {target:g} plus "
                  f"one standard error) on {n_queries} sampled queries: {best.recall:.3f}, "
                  f"{best.reranked:.0f} rows re-ranked per query")
