"""``lshdist ingest``: input files to a sharded Zarr dataset."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from lshdist.inputs import FORMATS, REGISTRY, WEIGHTINGS, read_inputs
from lshdist.jobs.common import non_negative_int, positive_int
from lshdist.store.atomic import check_output
from lshdist.store.dataset import DEFAULT_SHARD_ROWS

logger = logging.getLogger(__name__)


def _row_range(text: str) -> tuple[int, int]:
    try:
        start, stop = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give START:STOP, e.g. 0:16000") from None
    return start, stop


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ingest`` to the ``lshdist`` subcommands (``subparsers`` of `add_subparsers`)."""
    formats = "; ".join(f"{name}: {f.title}" for name, f in REGISTRY.items())
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
        choices=FORMATS,
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
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    check_output(args.out, args.overwrite)  # refuse before spending time reading
    data = read_inputs(
        args.inputs,
        format=args.format,
        labels=args.labels,
        label_column=args.label_column,
        header=args.header,
        id_column=args.id_column,
        id_offset=args.id_offset,
        weighting=args.weighting,
        idf_from=args.idf_from,
    )
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
