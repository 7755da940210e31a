"""The input checks every index kind's plan makes on the driver, before any cluster starts: a
dataset against the model it is hashed or searched with, an index's model against its record,
a query job's inputs and output."""

from __future__ import annotations

from typing import Any

from lshdist.errors import InputError
from lshdist.store.atomic import check_output
from lshdist.store.dataset import Dataset
from lshdist.store.manifest import IndexManifest
from lshdist.store.model import read_model_meta


def check_data_for_model(ds: Dataset, meta: dict[str, Any], what: str) -> None:
    """The dataset's kind and d against the model's (from model.json, no arrays loaded)."""
    emb = meta.get("embedding")
    if emb is not None or ds.stored_kind == "pointsets":
        check_sets_for_model(ds, emb, what)
        return
    sparse_model = bool(meta.get("sparse"))
    if (ds.kind == "sparse") != sparse_model:
        raise InputError(f"{what} {str(ds.path)!r} is {ds.kind}, but the model was learned on "
                         f"{'sparse' if sparse_model else 'dense'} data")
    if ds.d != meta["d"]:
        raise InputError(f"{what} {str(ds.path)!r} has {ds.d} features, but the model was "
                         f"learned on {meta['d']}")


def index_model_meta(index: str, manifest: IndexManifest) -> dict[str, Any]:
    """model.json of the model an index was built with, checked against the index's record."""
    try:
        meta = read_model_meta(manifest.model)
    except InputError as exc:
        raise InputError(f"the model of index {index!r} cannot be read: {exc}") from None
    if meta["checksum"] != manifest.model_checksum:
        raise InputError(f"the model at {manifest.model!r} does not match index {index!r} "
                         "(checksums differ); rebuild the index or restore the model")
    return meta


def check_query_inputs(index: str, manifest: IndexManifest, queries: str, out: str,
                       overwrite: bool) -> tuple[dict[str, Any], Dataset]:
    """The checks every k-NN query job makes before a cluster starts: the index's model
    (`index_model_meta`), the queries against it, the results directory; returns
    ``(model meta, queries dataset)``."""
    meta = index_model_meta(index, manifest)
    qds = Dataset(queries)
    check_data_for_model(qds, meta, "queries dataset")
    check_output(out, overwrite, kind="lshdist-results",
                 inputs=(index, queries, manifest.model))
    return meta, qds


def check_sets_for_model(ds: Dataset, emb: dict[str, Any] | None, what: str) -> None:
    """A point-set dataset against a model's set embedding (model.json's ``embedding``)."""
    if emb is None:
        raise InputError(f"{what} {str(ds.path)!r} holds sets of local features, but the model "
                         "was learned on vectors: learn one on point sets with "
                         "`lshdist learn --kernel pmk|pdk`")
    if ds.stored_kind != "pointsets":
        raise InputError(f"{what} {str(ds.path)!r} holds {ds.stored_kind} vectors, but the "
                         f"model embeds sets of local features ({emb['kernel']}); give a "
                         "point-set dataset (`lshdist ingest --features`)")
    if int(ds.attrs["d"]) != emb["d"]:
        raise InputError(f"{what} {str(ds.path)!r} has points of {ds.attrs['d']} features, "
                         f"but the model's {emb['kernel']} embedding was fitted on {emb['d']}; "
                         "ingest it with the same --features")
    if emb["kernel"] == "pdk" and not ds.has_coords:
        raise InputError(f"{what} {str(ds.path)!r} has no image coordinates, which the PDK "
                         "needs; ingest the images with --features (coordinates are kept)")
