"""``lshdist ingest``: input files to a sharded Zarr dataset."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from lshdist.jobs.common import add_cluster_options, non_negative_int, positive_int
from lshdist.store.atomic import check_output
from lshdist.store.objects import local_copies, tree_bytes

logger = logging.getLogger(__name__)

# What the parser shows, copied from the modules that own it: importing those (the readers,
# the feature extractors, the dataset store) loads numba, Zarr and Dask, a second and more
# before `lshdist ingest --help` could answer.  A test checks each copy against its owner.
#: `lshdist.inputs.REGISTRY`: ``--format`` names and titles, in detection order
FORMAT_TITLES = {
    "npy": "NumPy matrix",
    "npz": "NumPy arrays X, y, ids or a scipy sparse matrix",
    "parquet": "Parquet table",
    "idx": "IDX images and labels files, as Fashion-MNIST",
    "letter": "UCI Letter",
    "newsgroups": "20 Newsgroups tab-separated text",
    "csv": "CSV or TSV",
    "zarr": "an lshdist dataset, to re-shard",
}
#: `lshdist.inputs.WEIGHTINGS`, `lshdist.embed.features.FEATURES`,
#: `lshdist.store.dataset.DEFAULT_SHARD_ROWS`
WEIGHTINGS = ("tfidf", "counts")
FEATURES = ("dense-patches", "daisy", "orb", "sift")
DEFAULT_SHARD_ROWS = 10_000


def _row_range(text: str) -> tuple[int, int]:
    try:
        start, stop = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give START:STOP, e.g. 0:16000") from None
    return start, stop


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ingest`` to the ``lshdist`` subcommands (``subparsers`` of `add_subparsers`)."""
    formats = "; ".join(f"{name}: {title}" for name, title in FORMAT_TITLES.items())
    p: argparse.ArgumentParser = subparsers.add_parser(
        "ingest",
        help="turn data files into a sharded Zarr dataset",
        description=(
            "Read INPUT files, concatenate them in order and write one dataset. Formats, "
            f"detected from each file unless --format is given: {formats}. IDX images files "
            "are paired with their labels files among the INPUTs."
        ),
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="input files or dataset directories")
    p.add_argument("--out", required=True, metavar="DATASET", help="output dataset directory")
    p.add_argument(
        "--shard-rows",
        type=positive_int,
        default=DEFAULT_SHARD_ROWS,
        metavar="N",
        help="rows per shard (default %(default)s)",
    )
    p.add_argument(
        "--format",
        choices=tuple(FORMAT_TITLES),
        help="input format of every INPUT (default: detected per input)",
    )
    p.add_argument(
        "--labels",
        action="append",
        metavar="FILE.npy",
        help="labels of an input without its own (repeat once per INPUT, in order; "
        "default: none, labels come from the inputs)",
    )
    p.add_argument(
        "--label-column",
        metavar="NAME|INDEX",
        help="label column of CSV/Parquet inputs (default: a column named 'label' or 'y', "
        "else none)",
    )
    p.add_argument(
        "--id-column",
        metavar="NAME|INDEX",
        help="CSV/Parquet inputs: the column of row ids, unique int64 values; it is not a "
        "feature (default: none, rows are numbered 0..N-1)",
    )
    p.add_argument(
        "--id-offset",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="add N to every row id: rows get ids N..N+rows-1 (with --rows START:STOP, "
        "N+START..N+STOP-1), and ids the inputs carry (an .npz 'ids' array, --id-column, a "
        "re-sharded dataset) are shifted by N too (default %(default)s)",
    )
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CSV inputs have (or have not) a header row (default: guessed)",
    )
    p.add_argument(
        "--weighting",
        choices=WEIGHTINGS,
        help="text inputs: token weights (default: tfidf)",
    )
    p.add_argument(
        "--idf-from",
        metavar="DATASET",
        help="text inputs: use the IDF of this dataset (ingest the training split first; "
        "default: the IDF of the inputs themselves)",
    )
    p.add_argument(
        "--rows",
        type=_row_range,
        metavar="START:STOP",
        help="keep only rows START:STOP of the concatenated input (a train/test split of one "
        "file, e.g. Letter's 0:16000 and 16000:20000); rows keep their ids (default: all rows)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output (default: refuse to)",
    )
    g = p.add_argument_group(
        "images to sets of local features",
        "With --features the INPUTs are images — IDX image files (each followed by its labels "
        "file), .npz files of images (X: N x H x W, optional y), or one image folder with a "
        "sub-folder per class — and the dataset holds one set of local features per image, "
        "with image coordinates (kind pointsets; learn over it with --kernel pmk|pdk). The "
        "features are extracted on the cluster (options below).")
    g.add_argument("--features", choices=FEATURES,
                   help="the local features: pixel patches on a grid, DAISY on a grid, ORB or "
                   "SIFT keypoints (scikit-image); default: none, the inputs are vectors")
    g.add_argument("--patch", type=positive_int, default=4, metavar="P",
                   help="dense-patches: patch side; daisy: descriptor radius (default "
                   "%(default)s)")
    g.add_argument("--step", type=positive_int, default=4, metavar="S",
                   help="dense-patches, daisy: grid step in pixels (default %(default)s)")
    g.add_argument("--keypoints", type=positive_int, default=50, metavar="K",
                   help="orb, sift: at most K keypoints per image (default %(default)s)")
    add_cluster_options(p)
    p.set_defaults(func=run)
    return p


def _read(args: argparse.Namespace, inputs: list[str], labels: list[str] | None) -> Any:
    from lshdist.inputs import read_inputs

    return read_inputs(
        inputs,
        format=args.format,
        labels=labels,
        label_column=args.label_column,
        header=args.header,
        id_column=args.id_column,
        id_offset=args.id_offset,
        weighting=args.weighting,
        idf_from=args.idf_from,
    )


def run(args: argparse.Namespace) -> int:
    if args.features is not None:
        return run_features(args)
    start = time.perf_counter()
    check_output(args.out, args.overwrite)  # refuse before spending time reading
    with local_copies([*args.inputs, *(args.labels or [])]) as files:
        n = len(args.inputs)
        data = _read(args, files[:n], files[n:] or None)
    if args.rows is not None:
        data = data.rows(*args.rows)
    ds = data.write(args.out, shard_rows=args.shard_rows, overwrite=args.overwrite)
    classes = "unlabelled" if ds.classes is None else f"{len(ds.classes)} classes"
    d = "hashed 64-bit feature ids" if ds.kind == "sparse" and ds.d == 2**64 else f"{ds.d} features"
    nnz = f", {ds.nnz} nonzeros" if ds.kind == "sparse" else ""
    print(
        f"ingested {ds.n} rows x {d} ({ds.kind}{nnz}, {classes}) from {len(args.inputs)} "
        f"input(s) into {str(ds.path)!r}: {ds.n_shards} shard(s) of <= {args.shard_rows} rows "
        f"in {time.perf_counter() - start:.1f}s"
    )
    return 0


#: images per extraction task
IMAGES_PER_TASK = 2_000


def run_features(args: argparse.Namespace) -> int:
    """``ingest --features``: images to a point-set dataset, features extracted on Dask."""
    import numpy as np

    from lshdist.cluster.driver import progress as _progress
    from lshdist.config import ClusterConfig, from_args
    from lshdist.embed.features import extract_sets
    from lshdist.errors import InputError
    from lshdist.inputs.images import read_images
    from lshdist.jobs.common import client_from_config
    from lshdist.store.dataset import concat_sets, write_pointsets

    start = time.perf_counter()
    vector_only = {"--format": args.format, "--labels": args.labels,
                   "--label-column": args.label_column, "--id-column": args.id_column,
                   "--header": args.header, "--weighting": args.weighting,
                   "--idf-from": args.idf_from}
    given = [k for k, v in vector_only.items() if v is not None]
    if given:
        raise InputError(f"{', '.join(given)} apply to vector inputs, not to --features "
                         "(images); drop them")
    cluster = from_args(ClusterConfig, args)
    check_output(args.out, args.overwrite)
    imgs = read_images(args.inputs)
    images, labels = imgs.images, imgs.labels
    lo, hi = (0, len(images)) if args.rows is None else args.rows
    if not 0 <= lo < hi <= len(images):
        raise InputError(f"--rows {lo}:{hi} is outside the {len(images)} images; give "
                         f"START:STOP with 0 <= START < STOP <= {len(images)}")
    images = images[lo:hi]
    labels = None if labels is None else labels[lo:hi]
    ids = np.arange(lo, hi, dtype=np.int64) + args.id_offset
    same = len({im.shape for im in images}) == 1
    chunks = [images[i:i + IMAGES_PER_TASK] for i in range(0, len(images), IMAGES_PER_TASK)]
    kw = dict(kind=args.features, patch=args.patch, step=args.step, keypoints=args.keypoints)
    logger.info("extracting %s features of %d images in %d tasks", args.features, len(images),
                len(chunks))
    with client_from_config(cluster) as client:
        futs = [client.submit(extract_sets, np.stack(c) if same else c, **kw, pure=False)
                for c in chunks]
        for _ in _progress(futs, "features", cluster.stall_timeout):
            pass
        parts = [f.result() for f in futs]
    sets = concat_sets(parts, parts[0].d)
    ds = write_pointsets(args.out, sets, labels, ids=ids, shard_rows=args.shard_rows,
                         overwrite=args.overwrite,
                         attrs={"features": {"kind": args.features, "patch": args.patch,
                                             "step": args.step, "keypoints": args.keypoints}})
    empty = int(np.sum(sets.sizes == 0))
    size = tree_bytes(ds.path)
    classes = "unlabelled" if ds.classes is None else f"{len(ds.classes)} classes"
    sys.stdout.write(
        f"ingested {ds.n} images as sets of {args.features} features ({len(sets.values)} "
        f"points of {sets.d} values, {len(sets.values) / ds.n:.1f} per set, {empty} empty "
        f"sets, {classes}) into {str(ds.path)!r}: {ds.n_shards} shard(s), "
        f"{size / ds.n:.0f} bytes per set on disk, in {time.perf_counter() - start:.1f}s\n")
    return 0
