"""Typed index manifests (`lshdist.store.manifest`): parsed once by `read_index_manifest`,
written through ``to_json()`` byte for byte as the JSON manifests lshdist wrote before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lshdist.errors import FormatError, InputError
from lshdist.index.calibrate import Calibration
from lshdist.index.subspace import Round
from lshdist.store.files import dump_json
from lshdist.store.index import (
    FORMAT,
    VERSION,
    PermutationManifest,
    SegmentEntry,
    SubspaceManifest,
    read_index_manifest,
    read_manifest,
    read_manifest_tagged,
    read_permutation_manifest,
    require_permutation,
    write_manifest,
)
from lshdist.store.manifest import (
    HashFamily,
    HyperplaneManifest,
    SegmentPart,
    SubspaceRecord,
    manifest_from_json,
)

SHA = "ab" * 32
SHA2 = "cd" * 32
NAMES = ["seg-00000000000000a1", "seg-00000000000000b2"]


def calibration() -> dict:
    return Calibration(k=10, target=0.9, n_database=1, n_queries=1, scan_seconds_per_query=1e-3,
                       points=(), mode="scan", chosen=None, reason="a test").to_json()


def permutation_json(**change) -> dict:
    """A permutation manifest as earlier versions wrote it (an append's: ``batches`` after
    ``rows``; a packed segment; a key this version does not know)."""
    packed = [{"rows": 3, "permutations": 4, "checksum": SHA},
              {"rows": 2, "permutations": 4, "checksum": SHA2}]
    from lshdist.store.index import packed_checksum

    m = {"format": FORMAT, "version": VERSION, "model": "/m", "model_checksum": SHA,
         "kind": "explicit", "d": 5, "bits": 64, "epsilon": None, "permutations": 4,
         "window": 2, "hamming_keep": 0, "seed": 3, "learned": True,
         "segments": [
             {"name": NAMES[0], "rows": 5, "permutations": 4,
              "checksum": packed_checksum([SHA, SHA2]), "parts": packed,
              "source": "/d", "start": 0, "stop": 5},
             {"name": NAMES[1], "rows": 7, "permutations": 4, "checksum": SHA,
              "source": "/d", "start": 5, "stop": 12, "note": "kept"}],
         "calibration": calibration(), "rows": 12, "batches": ["day1"], "future_field": [1, 2]}
    m.update(change)
    return m


def subspace_json() -> dict:
    """A subspace manifest written before ``target_recall`` was recorded."""
    return {"format": FORMAT, "version": VERSION, "method": "subspace", "model": "/m",
            "model_checksum": SHA, "kind": "explicit", "d": 5, "seed": 1, "rows": 9,
            "segments": [{"name": NAMES[0], "rows": 6, "group": 0, "final": False,
                          "checksum": SHA},
                         {"name": NAMES[1], "rows": 3, "group": 1, "final": True,
                          "checksum": SHA2}],
            "subspace": {"version": 1, "rank": 2, "bits": 16, "eta": 0.1, "alpha": 0.5,
                         "max_rounds": 4, "min_group": 2, "krylov_iters": 3, "n_probe": 1,
                         "n_candidates": 5,
                         "rounds": [{"round": 0, "remaining": 9, "alpha": 0.5,
                                     "threshold": 1.25, "captured": 6}],
                         "group_sizes": [6, 3], "subspaces_checksum": SHA}}


@pytest.mark.parametrize("raw", [
    permutation_json(),
    permutation_json(family={"name": "eh-hash", "samples": None, "version": 2},
                     learned=False),
    subspace_json(),
], ids=["permutation", "hyperplane", "subspace"])
def test_read_and_written_back_byte_for_byte(tmp_path, raw):
    """An index written before the manifest was typed (the JSON, key order and all) reads
    typed, and writing that object back gives the same file, byte for byte."""
    write_manifest(tmp_path, raw)  # as earlier versions wrote it
    before = (tmp_path / "index.json").read_bytes()
    m = read_index_manifest(tmp_path)
    assert m.to_json() == read_manifest(tmp_path)
    assert dump_json(m.to_json()).encode() == before
    write_manifest(tmp_path, m)
    assert (tmp_path / "index.json").read_bytes() == before


def test_each_kind_is_its_own_class_with_typed_fields(tmp_path):
    for kind in "phs":
        (tmp_path / kind).mkdir()
    write_manifest(tmp_path / "p", permutation_json())
    m = read_index_manifest(tmp_path / "p")
    assert type(m) is PermutationManifest and m.method == "permutation"
    assert (m.rows, m.bits, m.operating_point, m.batches) == (12, 64, (4, 2, 0), ("day1",))
    assert m.has_batch("day1") and not m.has_batch("day2") and not m.has_batch(None)
    first, second = m.segments
    assert first.parts == (SegmentPart(3, 4, SHA), SegmentPart(2, 4, SHA2))
    assert (first.n_parts, second.n_parts, second.parts) == (2, 1, None)
    assert (second.source, second.start, second.stop) == ("/d", 5, 12)
    assert second.extra == {"note": "kept"} and m.extra == {"future_field": [1, 2]}
    assert isinstance(m.calibration, Calibration) and m.calibration.reason == "a test"
    assert m.segment_names == NAMES
    with pytest.raises(AttributeError):
        _ = m.permutation  # type: ignore[attr-defined]  # misspelt: an error, not a None
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.rows = 13  # type: ignore[misc]

    write_manifest(tmp_path / "h", permutation_json(
        family={"name": "h-hash", "samples": None}, learned=False))
    h = read_index_manifest(tmp_path / "h")
    assert isinstance(h, HyperplaneManifest) and h.family == HashFamily("h-hash", None)
    assert h.family.paired and "version" not in h.to_json()["family"]

    write_manifest(tmp_path / "s", subspace_json())
    s = read_index_manifest(tmp_path / "s")
    assert isinstance(s, SubspaceManifest) and s.method == "subspace"
    assert s.subspace.rounds == (Round(round=0, remaining=9, alpha=0.5, threshold=1.25,
                                       captured=6),)
    assert s.subspace.target_recall is None and "target_recall" not in s.to_json()["subspace"]
    assert [(g.group, g.final) for g in s.segments] == [(0, False), (1, True)]
    with pytest.raises(InputError, match=r"is a subspace index \(--method subspace\); "
                                         r"compact supports permutation indexes only"):
        require_permutation(s, tmp_path / "s", "compact")
    with pytest.raises(InputError, match="subspace index"):
        read_permutation_manifest(tmp_path / "s", "--append")


def test_a_new_manifest_is_written_in_the_order_lshdist_always_wrote(tmp_path):
    """Built in code (no layout read from disk): the keys in the order of the build's JSON
    before it was typed -- the head, the parameters, segments, family, calibration, batches,
    rows, then the checksum that `write_manifest` appends."""
    head = dict(model="/m", model_checksum=SHA, kind="explicit", d=5, seed=3)
    m = PermutationManifest(**head, rows=0, segments=(), bits=64, epsilon=None, permutations=4,
                            window=2, hamming_keep=0, learned=False)
    assert "calibration" not in m.to_json() and m.calibration is None
    with pytest.raises(FormatError, match="has no 'calibration'"):
        write_manifest(tmp_path, m)  # not calibrated yet: refused, as the JSON was
    entry = SegmentEntry(name=NAMES[0], rows=5, permutations=4, checksum=SHA)
    entry = dataclasses.replace(entry, source="/d", start=0, stop=5)
    assert list(entry.to_json()) == ["name", "rows", "permutations", "checksum", "source",
                                     "start", "stop"]
    h = dataclasses.replace(m, segments=(entry,), rows=5, calibration_json=calibration(),
                            batches=("b",)).with_family(HashFamily("eh-hash", 8, 2))
    write_manifest(tmp_path, h)
    text = (tmp_path / "index.json").read_text()
    assert list(json.loads(text)) == [
        "format", "version", "model", "model_checksum", "kind", "d", "bits", "epsilon",
        "permutations", "window", "hamming_keep", "seed", "learned", "segments", "family",
        "calibration", "batches", "rows", "checksum"]
    got, tag = read_manifest_tagged(tmp_path)
    assert tag is None and got == dataclasses.replace(h, checksum=got.checksum)
    assert got.checksum is not None and json.dumps(got.to_json(), indent=2) == text

    record = SubspaceRecord(version=1, rank=2, bits=16, eta=0.1, alpha=None, max_rounds=4,
                            min_group=2, krylov_iters=3, n_probe=1, n_candidates=5,
                            target_recall=0.9, rounds=(), group_sizes=(), subspaces_checksum=SHA)
    s = SubspaceManifest(**head, rows=0, segments=(), subspace=record)
    assert list(s.to_json()) == ["format", "version", "method", "model", "model_checksum",
                                 "kind", "d", "seed", "rows", "segments", "subspace"]
    assert s.to_json()["subspace"]["target_recall"] == 0.9
    assert manifest_from_json(s.to_json()) == s


def test_a_typed_manifest_is_checked_as_the_json_was(tmp_path):
    """`write_manifest` checks what ``to_json()`` gives with the reader's rules."""
    m = manifest_from_json(permutation_json())
    bad = dataclasses.replace(m, rows=13)
    with pytest.raises(FormatError, match="rows=13 but its segments hold 12"):
        write_manifest(tmp_path, bad)
