"""Sets of local features in memory: ragged rows of points (values + offsets)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from lshdist.errors import InputError


@dataclass(frozen=True)
class PointSets:
    """``n`` sets of d-dimensional points, stored ragged.

    Attributes
    ----------
    values : ndarray, shape (T, d), float32
        The points of all sets, set after set.
    offsets : ndarray, shape (n + 1,), int64
        Set ``i`` is ``values[offsets[i]:offsets[i + 1]]``; ``offsets[0] == 0``.
    weights : ndarray, shape (T,), float32, or None
        Non-negative weight of each point (None: every point weighs 1).
    coords : ndarray, shape (T, 2), float32, or None
        Image coordinates of each point, where they exist (the PDK needs them).
    """

    values: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray | None = None
    coords: np.ndarray | None = None

    @classmethod
    def from_arrays(cls, values: ArrayLike, offsets: ArrayLike, *,
                    weights: ArrayLike | None = None,
                    coords: ArrayLike | None = None) -> PointSets:
        """Validated sets from ragged arrays."""
        V = np.asarray(values)
        if V.ndim != 2 or V.dtype.kind not in "biuf":
            raise InputError(f"values must be a numeric (T, d) array, got shape {V.shape} "
                             f"and dtype {V.dtype}")
        if not np.isfinite(V).all():
            raise InputError("values has NaN or infinite entries; drop or impute them first")
        off = np.asarray(offsets)
        if (off.ndim != 1 or len(off) < 1 or off.dtype.kind not in "iu" or off[0] != 0
                or off[-1] != len(V) or np.any(np.diff(off) < 0)):
            raise InputError(f"offsets must be non-decreasing integers from 0 to len(values)="
                             f"{len(V)}, got {off[:3]}...{off[-3:]} (length {len(off)})")
        w = None
        if weights is not None:
            w = np.ascontiguousarray(weights, dtype=np.float32)
            if w.shape != (len(V),) or not np.isfinite(w).all() or np.any(w < 0):
                raise InputError(f"weights must be finite, non-negative and of shape "
                                 f"({len(V)},), got shape {w.shape}")
        c = None
        if coords is not None:
            c = np.ascontiguousarray(coords, dtype=np.float32)
            if c.ndim != 2 or c.shape[0] != len(V) or not np.isfinite(c).all():
                raise InputError(f"coords must be finite and of shape ({len(V)}, k), "
                                 f"got shape {c.shape}")
        return cls(np.ascontiguousarray(V, dtype=np.float32), off.astype(np.int64), w, c)

    @classmethod
    def from_list(cls, sets: Sequence[ArrayLike], *,
                  weights: Sequence[ArrayLike] | None = None,
                  coords: Sequence[ArrayLike] | None = None) -> PointSets:
        """Sets from a list of (n_i, d) arrays (and per-set weights or coordinates)."""
        arrays = [np.asarray(s, dtype=np.float32) for s in sets]
        if not arrays:
            raise InputError("no sets given: pass at least one (n_i, d) array")
        d = {a.shape[1] if a.ndim == 2 else -1 for a in arrays}
        if len(d) != 1 or -1 in d:
            raise InputError(f"every set must be an (n_i, d) array with one d, got dims {d}")
        offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])])
        return cls.from_arrays(np.concatenate(arrays), offsets,
                               weights=_concat(weights, (-1,)), coords=_concat(coords, (-1, 2)))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def d(self) -> int:
        return int(self.values.shape[1])

    @property
    def sizes(self) -> np.ndarray:
        """Points in each set: int64 (n,)."""
        return np.diff(self.offsets)

    def set_of_point(self) -> np.ndarray:
        """The set each point belongs to: int64 (T,)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes)

    def take(self, rows: ArrayLike) -> PointSets:
        """Sets ``rows`` (integer indices), in that order."""
        r = np.asarray(rows, dtype=np.int64)
        starts, ends = self.offsets[r], self.offsets[r + 1]
        sizes = ends - starts
        idx = (np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
               + np.arange(int(sizes.sum())))
        off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return PointSets(self.values[idx], off,
                         None if self.weights is None else self.weights[idx],
                         None if self.coords is None else self.coords[idx])


def _concat(parts: Sequence[ArrayLike] | None, shape: tuple[int, ...]) -> np.ndarray | None:
    if parts is None:
        return None
    return np.concatenate([np.asarray(p, np.float32).reshape(shape) for p in parts])
