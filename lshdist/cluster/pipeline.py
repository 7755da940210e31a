"""Distributed index builds and bulk queries (ARCHITECTURE.md sections 1 and 4).

The hash family is built once from the model and broadcast to the workers; one task per segment
encodes its rows and writes the segment; the manifest is swapped in last.  Queries: segments are
loaded once into worker memory, one task per (query chunk, segment) runs where the segment
lives, partial top-k lists are merged per query chunk by a task that writes the Parquet parts.
The driver holds neither the database nor the results.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path


from lshdist.cluster import tasks
from lshdist.errors import InputError
from lshdist.hashing.families import check_bits
from lshdist.index.params import resolve_permutations
from lshdist.store.atomic import check_output
from lshdist.store.dataset import Dataset
from lshdist.store.index import FORMAT, VERSION, new_segment_name, read_manifest, write_manifest
from lshdist.store.model import read_model_meta

log = logging.getLogger(__name__)
MODES = ("hash", "scan")


def _ranges(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + size)) for s in range(0, n, size)]


def _check_data_for_model(ds: Dataset, meta: dict, what: str) -> None:
    """The dataset's kind and d against the model's (from model.json, no arrays loaded)."""
    sparse_model = bool(meta.get("sparse"))
    if (ds.kind == "sparse") != sparse_model:
        raise InputError(f"{what} {str(ds.path)!r} is {ds.kind}, but the model was learned on "
                         f"{'sparse' if sparse_model else 'dense'} data")
    if ds.d != meta["d"]:
        raise InputError(f"{what} {str(ds.path)!r} has {ds.d} features, but the model was "
                         f"learned on {meta['d']}")


def broadcast_family(client, model: str, *, bits: int, seed: int, learned: bool):
    """The hash family on every worker, built once; returns its future.

    One task loads the model (checksums verified) and builds the family on a worker; the result
    is replicated to the others.  Not ``client.scatter(..., broadcast=True)``: scattered data
    has no recipe, so a worker lost at the wrong moment cancels every task that needs it ("lost
    dependencies", seen in testing); and not the object itself in the graph (10 MB for a
    784-d explicit metric, sent with the graph).  This future is recomputed if every copy is
    lost.
    """
    fut = client.submit(tasks.load_family, str(Path(model).resolve()), bits, seed, learned,
                        pure=False, retries=2)
    client.replicate([fut])
    return fut


def _wait(futures, what: str) -> list:
    from distributed import as_completed

    done, t0, n = 0, time.perf_counter(), len(futures)
    for _ in as_completed(futures):
        done += 1
        bar = "#" * (20 * done // n)
        log.info("%-6s [%-20s] %d/%d tasks, %.1fs", what, bar, done, n, time.perf_counter() - t0)
    return [f.result() for f in futures]


def build_index(client, *, data: str, model: str, out: str, bits: int = 256,
                epsilon: float | None = None, permutations: int | None = None, window: int = 8,
                hamming_keep: int = 0, segment_rows: int = 100_000, learned: bool = True,
                seed: int = 0, append: bool = False, overwrite: bool = False) -> dict:
    """Index dataset ``data`` under ``model`` into directory ``out``; returns the manifest."""
    check_bits(bits)
    if segment_rows < 1:
        raise InputError(f"segment_rows={segment_rows}: must be >= 1")
    resolve_permutations(1, epsilon=epsilon, permutations=permutations)  # validates the pair
    ds = Dataset(data)
    model_meta = read_model_meta(model)
    _check_data_for_model(ds, model_meta, "dataset")
    out_path = Path(out)
    if append:
        manifest = read_manifest(out_path)
        if manifest["model_checksum"] != model_meta["checksum"]:
            raise InputError(f"index {out!r} was built with another model "
                             f"({manifest['model']!r}); append needs the same model")
        bits, window, hamming_keep, seed, learned = (manifest[k] for k in
                                                     ("bits", "window", "hamming_keep", "seed", "learned"))
        epsilon, permutations = manifest["epsilon"], manifest["permutations"]
    else:
        if out_path.exists():
            check_output(out_path, overwrite)
            if overwrite and not (out_path / "index.json").is_file():
                raise InputError(f"{out!r} exists and is not an lshdist index; refusing to "
                                 "overwrite it, remove it yourself")
        manifest = {
            "format": FORMAT, "version": VERSION, "model": str(Path(model).resolve()),
            "model_checksum": model_meta["checksum"], "kind": model_meta["kind"], "d": model_meta["d"],
            "bits": bits, "epsilon": epsilon, "permutations": permutations, "window": window,
            "hamming_keep": hamming_keep, "seed": seed, "learned": learned, "segments": [],
        }
    (out_path / "segments").mkdir(parents=True, exist_ok=True)
    family_f = broadcast_family(client, model, bits=bits, seed=seed, learned=learned)
    params = {"permutations": permutations, "epsilon": epsilon, "window": window,
              "hamming_keep": hamming_keep, "seed": seed}
    names = [new_segment_name() for _ in _ranges(ds.n, segment_rows)]
    futures = [
        client.submit(tasks.build_segment, str(ds.path), a, b, family_f, params, str(out_path),
                      name, pure=False, retries=2)
        for (a, b), name in zip(_ranges(ds.n, segment_rows), names)
    ]
    try:
        entries = _wait(futures, "index")
    except BaseException:
        client.cancel([*futures, family_f])
        for name in names:  # the manifest never named them: remove what the tasks wrote
            shutil.rmtree(out_path / "segments" / name, ignore_errors=True)
        if not manifest["segments"] and not (out_path / "index.json").exists():
            shutil.rmtree(out_path, ignore_errors=True)
        raise
    client.cancel([*futures, family_f])
    new_manifest = {**manifest, "segments": manifest["segments"] + entries}
    new_manifest["rows"] = int(sum(e["rows"] for e in new_manifest["segments"]))
    write_manifest(out_path, new_manifest)  # the swap: readers see the old or the new index
    return new_manifest


def query_index(client, *, index: str, queries: str, k: int, out: str, mode: str = "hash",
                query_chunk: int = 5_000, overwrite: bool = False) -> dict:
    """Bulk k-NN of every row of ``queries``; Parquet parts under ``out``."""
    from lshdist.validation import check_k

    k = check_k(k)
    if mode not in MODES:
        raise InputError(f"mode={mode!r}; choose one of {list(MODES)}")
    manifest = read_manifest(index)
    check_output(out, overwrite)
    try:
        model_meta = read_model_meta(manifest["model"])
    except InputError as exc:
        raise InputError(f"the model of index {index!r} cannot be read: {exc}") from None
    if model_meta["checksum"] != manifest["model_checksum"]:
        raise InputError(f"the model at {manifest['model']!r} does not match index {index!r} "
                         "(checksums differ); rebuild the index or restore the model")
    qds = Dataset(queries)
    _check_data_for_model(qds, model_meta, "queries dataset")
    family_f = broadcast_family(client, manifest["model"], bits=manifest["bits"],
                                seed=manifest["seed"], learned=manifest["learned"])
    segs = [client.submit(tasks.load_segment, str(index), e, manifest, pure=False, retries=2)
            for e in manifest["segments"]]
    out_path = Path(out)
    tmp = out_path.parent / f".{out_path.name}.tmp-{uuid.uuid4().hex[:12]}"
    (tmp / "neighbors").mkdir(parents=True)
    (tmp / "stats").mkdir()
    try:
        # every intermediate future stays referenced until the end: a lost worker's results
        # are then recomputed from their recipes instead of being given up
        writers, held = [], []
        for c, (a, b) in enumerate(_ranges(qds.n, query_chunk)):
            enc = client.submit(tasks.encode_queries, str(qds.path), a, b, family_f,
                                pure=False, retries=2)
            parts = [client.submit(tasks.search_segment, s, enc, k, mode, pure=False, retries=2)
                     for s in segs]
            held += [enc, *parts]
            writers.append(client.submit(tasks.merge_and_write, enc, parts, k, str(tmp), c,
                                         pure=False, retries=2))
        n = sum(_wait(writers, "query"))
        client.cancel(held)
        if out_path.exists():
            shutil.rmtree(out_path)
        os.rename(tmp, out_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        client.cancel([*segs, family_f])
    return {"queries": n, "segments": len(segs), "out": str(out_path)}
