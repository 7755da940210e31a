"""Index store: verified manifests and segments, range checks before kernels, lock, orphans."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from lshdist.errors import FormatError, InputError
from lshdist.index.calibrate import Calibration
from lshdist.index.payload import DensePayload, KernelPayload
from lshdist.index.permutation import PermutationIndex
from lshdist.store.index import (
    FORMAT,
    VERSION,
    index_lock,
    list_orphans,
    lock_path,
    manifest_checksum,
    new_segment_name,
    read_manifest,
    read_segment,
    remove_orphans,
    write_manifest,
    write_segment,
)

BITS = 70  # two words per key, the last one partly used


def fitted(n: int = 120, seed: int = 0) -> PermutationIndex:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**63, size=(n, 2), dtype=np.int64).astype(np.uint64)
    Z = rng.normal(size=(n, 5)).astype(np.float32)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)  # ids do not rise with rows
    return PermutationIndex(n_permutations=4, window=2, seed=seed).fit(
        codes, BITS, DensePayload(Z), ids)


def base_manifest() -> dict:
    return {"format": FORMAT, "version": VERSION, "model": "/m", "model_checksum": "a" * 64,
            "kind": "explicit", "d": 5, "bits": BITS, "epsilon": None, "permutations": 4,
            "window": 2, "hamming_keep": 0, "seed": 0, "learned": True, "segments": [],
            "rows": 0, "calibration": Calibration(
                k=10, target=0.9, n_database=1, n_queries=1, scan_seconds_per_query=1e-3,
                points=(), mode="scan", chosen=None, reason="a test manifest").to_json()}


@pytest.fixture
def index(tmp_path) -> Path:
    root = tmp_path / "idx"
    (root / "segments").mkdir(parents=True)
    entries = [write_segment(root, new_segment_name(), fitted(120 + s, s)).to_json()
               for s in range(2)]
    write_manifest(root, {**base_manifest(), "segments": entries,
                          "rows": sum(e["rows"] for e in entries)})
    return root


def edit_manifest(root: Path, change, *, reseal: bool = False) -> None:
    """Apply ``change`` to index.json; ``reseal`` recomputes the checksum (a careful forger)."""
    m = json.loads((root / "index.json").read_text())
    change(m)
    if reseal:
        m["checksum"] = manifest_checksum(m)
    (root / "index.json").write_text(json.dumps(m))


def test_segments_round_trip_bit_for_bit(index):
    m = read_manifest(index)
    assert m["rows"] == 241 and len(m["segments"]) == 2
    for s, entry in enumerate(m["segments"]):
        want, got = fitted(120 + s, s), read_segment(index, entry, m)
        for attr in ("ids_", "codes_", "positions_", "sorted_rows_", "sorted_prefix_"):
            assert np.array_equal(getattr(got, attr), getattr(want, attr)), attr
            assert getattr(got, attr).dtype == getattr(want, attr).dtype
        assert np.array_equal(got.payload_.Z, want.payload_.Z)


def test_segments_no_longer_store_prefixes_and_read_older_ones_that_do(index):
    """New segments hold no ``sorted_prefix`` (recomputed from the keys at load: the same
    array); a segment written before, with the prefixes stored, still reads and verifies."""
    from lshdist.store.index import _segment_checksum, segment_path, segment_zarr_arrays

    m = read_manifest(index)
    entry = m["segments"][0]
    path = segment_path(index, entry["name"])
    assert not (path / "sorted_prefix").exists() and (path / "sorted_rows").exists()
    want = fitted(120, 0)
    old = {"ids": want.ids_, "codes": want.codes_, "positions": want.positions_,
           "sorted_rows": want.sorted_rows_, "sorted_prefix": want.sorted_prefix_,
           "payload/Z": want.payload_.Z}
    segment_zarr_arrays(path, old, {"payload": "dense", "bits": BITS})
    edit_manifest(index, lambda mm: mm["segments"][0].update(checksum=_segment_checksum(old)),
                  reseal=True)
    m = read_manifest(index)
    got = read_segment(index, m["segments"][0], m)
    assert np.array_equal(got.sorted_prefix_, want.sorted_prefix_)


def test_keys_that_do_not_match_the_list_order_are_refused():
    """Recomputed prefixes must ascend: two entries of a list swapped (still a permutation,
    so every range check passes) are caught."""
    state = state_of(fitted())
    state.pop("sorted_prefix")
    back = PermutationIndex.from_state(**state)
    assert np.array_equal(back.sorted_prefix_, fitted().sorted_prefix_)
    rows = state["sorted_rows"]
    rows[1, [0, -1]] = rows[1, [-1, 0]]
    with pytest.raises(InputError, match="do not belong together"):
        PermutationIndex.from_state(**state)


def test_write_manifest_leaves_the_callers_dict_alone(tmp_path):
    m = base_manifest()
    write_manifest(tmp_path, m)
    assert "checksum" not in m and read_manifest(tmp_path)["checksum"] == manifest_checksum(m)
    with pytest.raises(FormatError, match="has no 'rows'"):
        write_manifest(tmp_path, {k: v for k, v in m.items() if k != "rows"})


def test_manifest_without_or_with_a_wrong_checksum_is_refused(index):
    edit_manifest(index, lambda m: m.update(window=3))
    with pytest.raises(FormatError, match=r"index.json does not match its checksum .*edited"):
        read_manifest(index)
    edit_manifest(index, lambda m: m.pop("checksum"))
    with pytest.raises(FormatError, match=r"index.json has no checksum"):
        read_manifest(index)


@pytest.mark.parametrize("key", sorted(base_manifest()))
def test_every_missing_field_is_named(index, key):
    if key in ("format", "version"):
        return  # refused as not an index / another version
    edit_manifest(index, lambda m: m.pop(key), reseal=True)
    with pytest.raises(FormatError, match=f"has no '{key}'"):
        read_manifest(index)


@pytest.mark.parametrize("key,value,match", [
    ("bits", "70", "bits='70' is not an integer"),
    ("learned", 1, "learned=1 is not true or false"),
    ("window", True, "window=True is not an integer"),
    ("window", 0, "window=0 out of range"),
    ("epsilon", -1.0, "epsilon=-1.0 out of range"),
    ("kind", "fancy", "kind='fancy' out of range"),
    ("segments", {}, "segments={} is not a list"),
    ("rows", 7, "rows=7 but its segments hold 241"),
    ("permutations", 5, "4 permutations, the index has M=5"),
    ("version", 1, "index format version 1, this lshdist reads 2; rebuild"),
])
def test_mistyped_fields_are_refused(index, key, value, match):
    edit_manifest(index, lambda m: m.update({key: value}), reseal=True)
    with pytest.raises(FormatError, match=match):
        read_manifest(index)


@pytest.mark.parametrize("name", ["../seg-0123456789abcdef", "/etc", "seg-0123456789ABCDEF",
                                  "seg-0123456789abcdef/../../x", "", 7])
def test_segment_names_must_be_ours(index, name):
    edit_manifest(index, lambda m: m["segments"][0].update(name=name), reseal=True)
    with pytest.raises(FormatError, match=r"is not (seg-<16 hex digits>|a segment name)"):
        read_manifest(index)


def test_symlinked_segment_outside_the_index_is_refused(index, tmp_path):
    entry = read_manifest(index)["segments"][0]
    seg = index / "segments" / entry["name"]
    seg.rename(tmp_path / "elsewhere")
    seg.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FormatError, match="outside"):
        read_manifest(index)


def test_duplicated_and_dropped_entries(index):
    edit_manifest(index, lambda m: (m["segments"].append(m["segments"][0]),
                                    m.update(rows=m["rows"] + m["segments"][0]["rows"])),
                  reseal=True)
    with pytest.raises(FormatError, match=r"segments\[2\]: segment 'seg-[0-9a-f]+' is listed "
                                          "twice"):
        read_manifest(index)


def test_damaged_segment_names_itself_and_the_fix(index):
    m = read_manifest(index)
    entry = m["segments"][1]
    array = index / "segments" / entry["name"] / "sorted_rows"
    chunk = next(p for p in sorted(array.rglob("*"))
                 if p.is_file() and p.relative_to(array).parts[0] == "c")
    raw = bytearray(chunk.read_bytes())
    raw[5] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    read_segment(index, m["segments"][0], m)  # the other segment is fine
    with pytest.raises(FormatError, match=f"segment '{entry['name']}' .* does not match its "
                       f"checksum .*restore segment '{entry['name']}'"):
        read_segment(index, entry, m)
    chunk.unlink()  # zarr would read fill values: the checksum notices
    with pytest.raises(FormatError, match="does not match its checksum"):
        read_segment(index, entry, m)


# -- ranges checked before any kernel ------------------------------------------------------

def state_of(ix: PermutationIndex) -> dict:
    return {"window": 2, "hamming_keep": 0, "seed": 0, "bits": BITS, "codes": ix.codes_.copy(),
            "positions": ix.positions_.copy(), "sorted_prefix": ix.sorted_prefix_.copy(),
            "sorted_rows": ix.sorted_rows_.copy(), "payload": ix.payload_, "ids": ix.ids_.copy()}


@pytest.mark.parametrize("plant,match", [
    (lambda s: s["sorted_rows"].__setitem__((1, 3), 120), r"sorted_rows hold rows in \[0, 120\], "
                                                           r"outside \[0, 120\)"),
    (lambda s: s["sorted_rows"].__setitem__((2, 0), -1), "outside"),
    (lambda s: s["sorted_rows"].__setitem__((0, 0), s["sorted_rows"][0, 1]),
     r"sorted_rows\[0\] is not a permutation of 0..119 \(1 rows missing\)"),
    (lambda s: s.update(sorted_rows=s["sorted_rows"][:, :-1]), "sorted_rows must be"),
    (lambda s: s.update(sorted_rows=s["sorted_rows"].astype(np.float64)), "sorted_rows must be"),
    (lambda s: s.update(sorted_prefix=s["sorted_prefix"][:3]), "sorted_prefix must be"),
    (lambda s: s["sorted_prefix"].__setitem__((0, 0), np.uint64(2**64 - 1)), "not ascending"),
    (lambda s: s["positions"].__setitem__((0, 5), BITS), r"outside \[0, 70\)"),
    (lambda s: s["positions"].__setitem__((0, 5), s["positions"][0, 6]), "repeat a bit"),
    (lambda s: s.update(positions=s["positions"][:, :10]), r"positions must be int64 \(M, 64\)"),
    (lambda s: s.update(codes=s["codes"][:, :1]), "codes have 1 words per key, but 70 bits need 2"),
    (lambda s: s.update(ids=s["ids"][:-1]), r"ids must be int64 \(120,\)"),
    (lambda s: s.update(payload=DensePayload(s["payload"].Z[:-1])), "payload has 119 rows"),
    (lambda s: s.update(window=0), "window=0"),
    (lambda s: s.update(bits=True), "bits=True"),
])
def test_out_of_range_state_never_reaches_a_kernel(plant, match):
    state = state_of(fitted())
    plant(state)
    with pytest.raises(InputError, match=match):
        PermutationIndex.from_state(**state)


def test_consistent_state_searches_like_the_original():
    ix = fitted()
    back = PermutationIndex.from_state(**state_of(ix))
    q = ix.codes_[:7]
    qp = DensePayload(ix.payload_.Z[:7])
    assert all(np.array_equal(a, b) for a, b in zip(ix.search(q, qp, 3)[:2],
                                                    back.search(q, qp, 3)[:2]))


def test_payload_arrays_are_checked():
    with pytest.raises(InputError, match=(r"dense payload has arrays \['Z'\] or "
                                          r"\['U', 'lo', 'step'\], got \['Y'\]")):
        DensePayload.from_arrays({"Y": np.zeros((2, 2), np.float32)})
    with pytest.raises(InputError, match="'Z' must be 2-d float32, got 2-d float64"):
        DensePayload.from_arrays({"Z": np.zeros((2, 2))})
    good = {"indptr": np.array([0, 2, 3]), "indices": np.array([1, 5, 2], np.uint64),
            "data": np.ones(3, np.float32), "kx": np.zeros((2, 4), np.float32),
            "sx": np.zeros(2)}
    assert len(KernelPayload.from_arrays(good)) == 2
    for change, match in [({"indptr": np.array([0, 4, 3])}, "indptr must ascend"),
                          ({"indptr": np.array([0, 3])}, "expected N\\+1, N and N"),
                          ({"data": np.ones(2, np.float32)}, "data has 2 entries, indices 3"),
                          ({"kx": np.zeros((3, 4), np.float32)}, "kx 3 rows")]:
        with pytest.raises(InputError, match=match):
            KernelPayload.from_arrays({**good, **change})
    db = DensePayload(np.zeros((3, 4), np.float32))
    with pytest.raises(InputError, match="queries have 3 payload columns, the index 4"):
        db.rerank(np.array([0, 1]), np.array([0]), DensePayload(np.zeros((1, 3), np.float32)), 1,
                  np.arange(3))


# -- the build lock --------------------------------------------------------------------------

def _hold(index_dir: str, log_file: str, hold: float, timeout: float) -> None:
    with index_lock(index_dir, timeout=timeout):
        start = time.time()
        time.sleep(hold)
        with open(log_file, "a") as f:
            f.write(f"{os.getpid()} {start} {time.time()}\n")


def test_two_processes_take_turns(tmp_path):
    ctx = mp.get_context("spawn")
    log_file = tmp_path / "log"
    procs = [ctx.Process(target=_hold, args=(str(tmp_path / "idx"), str(log_file), 0.5, 60))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    spans = sorted(tuple(map(float, line.split()[1:])) for line in log_file.read_text().split("\n")
                   if line)
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]  # one after the other
    assert not lock_path(tmp_path / "idx").exists()


def test_a_held_lock_times_out_naming_its_owner(tmp_path):
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=_hold, args=(str(tmp_path / "idx"), str(tmp_path / "log"), 5, 60))
    p.start()
    try:
        deadline = time.time() + 30
        while time.time() < deadline:  # until the holder has written its record
            try:
                json.loads(lock_path(tmp_path / "idx").read_text())
                break
            except (FileNotFoundError, ValueError):
                time.sleep(0.02)
        t = time.monotonic()
        with pytest.raises(InputError, match=f"is locked by pid {p.pid} on host "
                           f"'{re.escape(socket.gethostname())}' since .*if that process is "
                           "gone, remove"), index_lock(tmp_path / "idx", timeout=0.3):
            pass
        assert 0.3 <= time.monotonic() - t < 3
    finally:
        p.kill()
        p.join()


def _exit() -> None:
    pass


def test_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_exit)
    p.start()
    p.join()
    lock = lock_path(tmp_path / "idx")
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": p.pid, "proc_start": None,
                                "started": time.time(), "token": "x"}))
    with caplog.at_level(logging.WARNING, logger="lshdist.store.index"), \
            index_lock(tmp_path / "idx", timeout=0) as me:
        assert json.loads(lock.read_text())["token"] == me["token"]
    assert f"pid {p.pid} on this host, is gone" in caplog.text
    assert not lock.exists()


def test_old_lock_of_another_host_is_taken_over(tmp_path, caplog):
    lock = lock_path(tmp_path / "idx")
    owner = {"host": "elsewhere", "pid": 1, "started": time.time() - 100, "token": "x"}
    lock.write_text(json.dumps(owner))
    with pytest.raises(InputError, match="locked by pid 1 on host 'elsewhere'"), \
            index_lock(tmp_path / "idx", timeout=0):
        pass
    with caplog.at_level(logging.WARNING, logger="lshdist.store.index"), \
            index_lock(tmp_path / "idx", timeout=0, stale_after=50):
        pass
    assert "more than 50s" in caplog.text


# -- orphans -------------------------------------------------------------------------------

def test_orphans_are_listed_and_removed_under_the_lock(index, tmp_path):
    stray = index / "segments" / new_segment_name()
    stray.mkdir()
    (index / ".index.json.tmp-0123abcd").write_text("{}")
    (tmp_path / ".idx.old-0123abcd").mkdir()
    (tmp_path / ".idx.tmp-4567abcd").mkdir()
    (tmp_path / ".other.tmp-4567abcd").mkdir()  # another artefact's: not ours
    found = list_orphans(index)
    assert {p.name for p in found} == {stray.name, ".index.json.tmp-0123abcd", ".idx.old-0123abcd",
                                       ".idx.tmp-4567abcd"}
    assert remove_orphans(index, dry_run=True) == found and stray.exists()
    with index_lock(index, timeout=0), pytest.raises(InputError, match="is locked"):
        remove_orphans(index, timeout=0)
    assert remove_orphans(index) == found
    assert list_orphans(index) == [] and (tmp_path / ".other.tmp-4567abcd").exists()
    m = read_manifest(index)
    for e in m["segments"]:
        read_segment(index, e, m)


def test_a_segment_stores_every_chunk(tmp_path):
    """All-zero payload rows are written too (zarr's ``write_empty_chunks``), and read back."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2**63, size=(40, 2), dtype=np.int64).astype(np.uint64)
    index = PermutationIndex(n_permutations=4, window=2, seed=0).fit(
        codes, BITS, DensePayload(np.zeros((40, 5), np.float32)), np.arange(40))
    root = tmp_path / "idx"
    (root / "segments").mkdir(parents=True)
    name = new_segment_name()
    entry = write_segment(root, name, index).to_json()
    write_manifest(root, {**base_manifest(), "segments": [entry], "rows": 40})
    seg = root / "segments" / name
    arrays = 0
    for meta in seg.rglob("zarr.json"):
        m = json.loads(meta.read_text())
        if m["node_type"] != "array":
            continue
        arrays += 1
        grid = m["chunk_grid"]["configuration"]["chunk_shape"]
        want = int(np.prod([-(-n // c) for n, c in zip(m["shape"], grid, strict=True)]))
        chunks = [f for f in (meta.parent / "c").rglob("*") if f.is_file()]
        assert len(chunks) == want, meta.parent.relative_to(seg)
    assert arrays >= 5
    m = read_manifest(root)
    back = read_segment(root, m["segments"][0], m)
    np.testing.assert_array_equal(back.payload_.Z, 0)
