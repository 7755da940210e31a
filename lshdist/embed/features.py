"""Local features of images as point sets (`PointSets`): what ``lshdist ingest --features``
extracts, one set per image, with each point's image coordinates (row, column).

- ``dense-patches``: the pixels of ``patch x patch`` squares on a grid of step ``step``
  (values scaled to [0, 1]); constant squares (blank background) carry no local feature and
  are left out.  Our code: a strided view.
- ``daisy``: DAISY descriptors on a dense grid (scikit-image ``feature.daisy``; radius
  ``patch``, grid step ``step``).
- ``orb``: ORB keypoints and their 256-bit binary descriptors as 0/1 floats (scikit-image
  ``feature.ORB``, at most ``keypoints`` per image).
- ``sift``: SIFT keypoints and their 128-d descriptors (scikit-image ``feature.SIFT``).

ORB and SIFT need images larger than their sampling patterns (ORB's is 31 pixels across):
images whose shorter side is below ``min_side`` are upscaled (bilinear) first and the
coordinates mapped back.  An image in which a detector finds nothing becomes an empty set
(an all-zero embedding), counted in the ingest's report.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lshdist.embed.pointsets import PointSets
from lshdist.errors import InputError

#: the extractors of ``--features``
FEATURES = ("dense-patches", "daisy", "orb", "sift")


def _gray01(image: np.ndarray) -> np.ndarray:
    """A 2-d float64 image in [0, 1], colour averaged: integer images by their dtype's range,
    float images as given (in [0, 1]; `lshdist.inputs.images` scales a 0..255 float file as
    a whole, never an image by its own maximum)."""
    raw = np.asarray(image)
    if raw.ndim == 3:
        raw = raw[..., :3]
    if raw.ndim not in (2, 3):
        raise InputError(f"an image must be 2-d (gray) or 3-d (colour), got shape {raw.shape}")
    a = raw.astype(np.float64)
    if raw.dtype.kind in "ui":
        a /= float(np.iinfo(raw.dtype).max)
    elif a.size and (not np.isfinite(a).all() or a.min() < 0 or a.max() > 1):
        raise InputError(f"float images must hold values in [0, 1], got {a.min()}..{a.max()}; "
                         "rescale them before extracting features")
    return a.mean(axis=2) if a.ndim == 3 else a


def dense_patches(image: np.ndarray, patch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """``(features (n, patch*patch), coords (n, 2))`` of the non-constant grid patches."""
    from numpy.lib.stride_tricks import sliding_window_view

    img = _gray01(image)
    if min(img.shape) < patch:
        return np.zeros((0, patch * patch)), np.zeros((0, 2))
    win = sliding_window_view(img, (patch, patch))[::step, ::step]
    rows, cols = win.shape[:2]
    feats = win.reshape(rows * cols, patch * patch)
    rr, cc = np.meshgrid(np.arange(rows) * step, np.arange(cols) * step, indexing="ij")
    coords = np.stack([rr.ravel(), cc.ravel()], axis=1) + (patch - 1) / 2.0
    keep = np.ptp(feats, axis=1) > 0
    return feats[keep], coords[keep]


def _daisy(image: np.ndarray, radius: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    from skimage.feature import daisy

    img = _gray01(image)
    if min(img.shape) < 2 * radius + 1:
        raise InputError(f"DAISY with radius {radius} needs images of at least "
                         f"{2 * radius + 1} pixels a side, got {img.shape}; give a smaller "
                         "--patch")
    D = daisy(img, step=step, radius=radius, rings=2, histograms=6, orientations=8)  # type: ignore[no-untyped-call]
    rows, cols, dim = D.shape
    rr, cc = np.meshgrid(radius + np.arange(rows) * step, radius + np.arange(cols) * step,
                         indexing="ij")
    return D.reshape(rows * cols, dim), np.stack([rr.ravel(), cc.ravel()], axis=1)


def _keypoints(image: np.ndarray, kind: str, keypoints: int, min_side: int
               ) -> tuple[np.ndarray, np.ndarray]:
    from skimage.feature import ORB, SIFT
    from skimage.transform import rescale

    img = _gray01(image)
    scale = max(1.0, min_side / max(1, min(img.shape)))
    big = rescale(img, scale, order=1) if scale > 1 else img
    dim = 256 if kind == "orb" else 128
    detector = (ORB(n_keypoints=keypoints, fast_threshold=0.05)  # type: ignore[no-untyped-call]
                if kind == "orb" else SIFT(n_octaves=3))  # type: ignore[no-untyped-call]
    try:
        detector.detect_and_extract(big)  # type: ignore[no-untyped-call]
    except RuntimeError:  # scikit-image: "ORB found no features" and the like
        return np.zeros((0, dim)), np.zeros((0, 2))
    desc = np.asarray(detector.descriptors, np.float64)
    kp = np.asarray(detector.keypoints, np.float64) / scale
    if kind == "sift" and len(desc) > keypoints:  # scikit-image's SIFT has no response
        desc, kp = desc[:keypoints], kp[:keypoints]  # score: the first K it returns
    return desc.reshape(len(desc), dim), kp.reshape(len(kp), 2)


def extract_sets(images: Sequence[np.ndarray] | np.ndarray, kind: str, *, patch: int = 4,
                 step: int = 4, keypoints: int = 50, min_side: int = 96) -> PointSets:
    """Local features of each image as one set (with coordinates), in order."""
    if kind not in FEATURES:
        raise InputError(f"--features {kind!r}: choose one of {list(FEATURES)}")
    feats, coords = [], []
    for image in images:
        if kind == "dense-patches":
            f, c = dense_patches(image, patch, step)
        elif kind == "daisy":
            f, c = _daisy(image, patch, step)
        else:
            f, c = _keypoints(image, kind, keypoints, min_side)
        feats.append(np.asarray(f, np.float32))
        coords.append(np.asarray(c, np.float32))
    if not feats:
        raise InputError("no images given")
    dims = {f.shape[1] for f in feats}
    if len(dims) != 1:
        raise InputError(f"images gave features of different dimensions {sorted(dims)}")
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in feats])]).astype(np.int64)
    return PointSets.from_arrays(np.concatenate(feats), offsets,
                                 coords=np.concatenate(coords))
