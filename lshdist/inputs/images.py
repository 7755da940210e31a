"""Images for ``lshdist ingest --features``: IDX image files (with their labels files), ``.npz``
files of images (``X`` of shape N x H x W, optional ``y``), and image folders (one sub-folder
per class holding PNG/JPEG files, read with scikit-image)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lshdist.errors import FormatError, InputError
from lshdist.inputs.formats.idx import _read_idx_array, idx_ndim

#: file suffixes read from image folders
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass
class Images:
    """Images in order, with optional labels (names per image, or codes into ``classes``)."""

    images: list[np.ndarray]
    labels: np.ndarray | None
    sources: list[str]

    def __len__(self) -> int:
        return len(self.images)


def _folder(path: Path) -> Images:
    classes = sorted(p for p in path.iterdir() if p.is_dir())
    if not classes:
        raise InputError(f"image folder {str(path)!r} has no sub-folders: put the images of "
                         "each class in a folder named after the class")
    from skimage.io import imread

    images, labels = [], []
    for c in classes:
        files = sorted(f for f in c.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        for f in files:
            try:
                images.append(np.asarray(imread(f)))
            except Exception as exc:  # imageio/PIL raise many types for a broken file
                raise FormatError(f"{str(f)!r} is not a readable image ({type(exc).__name__}: "
                                  f"{exc}); remove or replace it") from None
            labels.append(c.name)
    if not images:
        raise InputError(f"image folder {str(path)!r} holds no {'/'.join(IMAGE_SUFFIXES)} "
                         "files in its class folders")
    return Images(images, np.asarray(labels), [str(path)])


def _npz(path: Path) -> Images:
    try:
        with np.load(path, allow_pickle=False) as z:
            if "X" not in z:
                raise InputError(f"{str(path)!r} has no array 'X'; save the images as "
                                 "np.savez(path, X=images, y=labels)")
            X = np.asarray(z["X"])
            y = np.asarray(z["y"]) if "y" in z else None
    except (ValueError, OSError) as exc:
        raise FormatError(f"{str(path)!r} is not a readable .npz ({exc})") from None
    if X.ndim not in (3, 4) or X.dtype.kind not in "uif" or len(X) == 0:
        raise InputError(f"{str(path)!r}: X must be N x H x W (or N x H x W x channels) "
                         f"numeric images, got {X.dtype} {X.shape}")
    if y is not None and len(y) != len(X):
        raise InputError(f"{str(path)!r}: y has {len(y)} labels for {len(X)} images")
    if X.dtype.kind == "f":  # one scale for the whole file: [0, 1] as given, or 0..255
        lo, hi = float(X.min()), float(X.max())
        if not (np.isfinite(lo) and np.isfinite(hi)) or lo < 0 or hi > 255:
            raise InputError(f"{str(path)!r}: float images must hold values in [0, 1] or "
                             f"[0, 255], got {lo}..{hi}; rescale X before ingesting")
        if hi > 1:
            X = X / np.float32(255)
    return Images(list(X), y, [str(path)])


def read_images(paths: list[str | os.PathLike[str]]) -> Images:
    """The images of ``paths`` in order: one image folder, or files — ``.npz`` files and IDX
    image files each followed by its labels file (or alone)."""
    ps = [Path(p) for p in paths]
    for p in ps:
        if not p.exists():
            raise InputError(f"input {str(p)!r} does not exist")
    if any(p.is_dir() for p in ps):
        if len(ps) != 1:
            raise InputError("give one image folder (with a sub-folder per class), or files")
        return _folder(ps[0])
    parts: list[Images] = []
    i = 0
    while i < len(ps):
        p = ps[i]
        if p.name.endswith(".npz"):
            parts.append(_npz(p))
            i += 1
            continue
        nd = idx_ndim(p)
        if nd < 3:
            raise InputError(f"{str(p)!r} is an IDX labels file; give each images file "
                             "followed by its labels file")
        X = _read_idx_array(p)
        y = None
        srcs = [str(p)]
        if i + 1 < len(ps) and not ps[i + 1].name.endswith(".npz") and idx_ndim(ps[i + 1]) == 1:
            y = _read_idx_array(ps[i + 1])
            if len(y) != len(X):
                raise InputError(f"labels file {str(ps[i + 1])!r} has {len(y)} labels, images "
                                 f"file {str(p)!r} has {len(X)} images")
            srcs.append(str(ps[i + 1]))
            i += 1
        parts.append(Images(list(X), y, srcs))
        i += 1
    labelled = {p.labels is not None for p in parts}
    if len(labelled) != 1:
        raise InputError("some inputs have labels and some have none; give labels for all "
                         "or for none")
    labels = (np.concatenate([np.asarray(p.labels) for p in parts])
              if parts[0].labels is not None else None)
    return Images([im for p in parts for im in p.images], labels,
                  [s for p in parts for s in p.sources])
