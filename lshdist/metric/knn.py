"""The k-NN vote over neighbours' labels (metric selection and the evaluation both count it)."""

from __future__ import annotations

import numpy as np


def knn_predict(neighbor_labels: np.ndarray, k: int, n_classes: int) -> np.ndarray:
    """Majority vote over the first k neighbours; a tie goes to the tied class whose member
    comes first (the nearest).  ``neighbor_labels``: int (Q, >=k), -1 for a missing neighbour."""
    lab = neighbor_labels[:, :k]
    Q = lab.shape[0]
    votes = np.zeros((Q, n_classes + 1), np.int64)
    np.add.at(votes, (np.repeat(np.arange(Q), k), np.where(lab >= 0, lab, n_classes).ravel()), 1)
    votes[:, n_classes] = 0
    best = votes.max(axis=1)
    pred = np.full(Q, -1, np.int64)
    for t in range(k):  # the nearest neighbour whose class has the best count
        c = lab[:, t]
        hit = (pred < 0) & (c >= 0) & (votes[np.arange(Q), np.maximum(c, 0)] == best)
        pred[hit] = c[hit]
    return pred
