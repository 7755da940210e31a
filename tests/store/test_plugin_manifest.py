"""Manifests of plug-in index kinds: checked by the store like every index's, their segments
written and verified, the kind's own params checked by its class, refusals that say what."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

import numpy as np
import pytest

from lshdist.errors import FormatError
from lshdist.store.index import (
    KindManifest,
    _segment_checksum,
    new_segment_name,
    read_arrays_segment,
    read_index_manifest,
    read_manifest,
    verify_index_manifest,
    write_arrays_segment,
    write_manifest,
)
from lshdist.store.manifest import known_methods, register_manifest


@register_manifest
@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyManifest(KindManifest):
    method: ClassVar[str] = "toy-kind"

    @classmethod
    def check_params(cls, params: Any, where: str) -> None:
        if not isinstance(params.get("width"), int):
            raise FormatError(f"{where}: params.width={params.get('width')!r} is not an integer")


def _index(tmp_path, rows=(5, 7)):
    root = tmp_path / "idx"
    (root / "segments").mkdir(parents=True)
    entries, start = [], 0
    for n in rows:
        ids = np.arange(start, start + n, dtype=np.int64)
        start += n
        entries.append(write_arrays_segment(root, new_segment_name(),
                                            {"ids": ids, "X": np.ones((n, 3), np.float32)}))
    m = ToyManifest(model="/m", model_checksum="a" * 64, kind="explicit", d=3, seed=0,
                    rows=sum(rows), segments=tuple(entries), params={"width": 4})
    write_manifest(root, m)
    return root, m


def test_written_read_and_verified(tmp_path):
    root, m = _index(tmp_path)
    assert "toy-kind" in known_methods()
    got = read_index_manifest(root)
    assert isinstance(got, ToyManifest) and got.segments == m.segments
    assert got.params == {"width": 4} and got.rows == 12
    assert json.loads((root / "index.json").read_text())["method"] == "toy-kind"
    arrays, _ = read_arrays_segment(root, got.segments[1])
    assert np.array_equal(arrays["ids"], np.arange(5, 12))
    assert verify_index_manifest(root) == got


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r["params"].update(width="wide"), r"params.width='wide' is not an integer"),
    (lambda r: r["segments"].append(dict(r["segments"][0])), "is listed twice"),
    (lambda r: r.update(rows=13), "its segments hold 12 rows"),
    (lambda r: r["segments"][0].update(rows=0), "expected an integer >= 1"),
    (lambda r: r["segments"][0].update(name="../../etc"), "is not seg-<16 hex digits>"),
    (lambda r: r.update(model_checksum="abc"), "model_checksum='abc': expected a sha256"),
])
def test_a_bad_plugin_manifest_is_refused_saying_what(tmp_path, edit, message):
    root, _ = _index(tmp_path)
    raw = read_manifest(root)
    edit(raw)
    with pytest.raises(FormatError, match=message):
        write_manifest(root, raw)  # the store checks what it would write as what it reads


def test_a_damaged_or_duplicated_segment_is_found(tmp_path):
    root, m = _index(tmp_path)
    seg = root / "segments" / m.segments[0].name
    chunk = next(p for p in (seg / "X").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.write_bytes(chunk.read_bytes()[:-3] + b"\x00\x01\x02")
    with pytest.raises(FormatError, match=f"segment '{m.segments[0].name}'.*"):
        verify_index_manifest(root)
    root2, m2 = _index(tmp_path / "b", rows=(4, 4))
    name = m2.segments[1].name
    write_arrays_segment(root2, name, {"ids": np.arange(4, dtype=np.int64),
                                       "X": np.ones((4, 3), np.float32)})
    fresh = _segment_checksum({"ids": np.arange(4, dtype=np.int64),
                               "X": np.ones((4, 3), np.float32)})
    write_manifest(root2, dataclasses.replace(
        m2, segments=(m2.segments[0], dataclasses.replace(m2.segments[1], checksum=fresh))))
    with pytest.raises(FormatError, match="holds id 0 twice"):
        verify_index_manifest(root2)


def test_nested_array_names_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"\['X/a'\] hold '/'; use flat names"):
        write_arrays_segment(tmp_path, new_segment_name(),
                             {"ids": np.arange(2, dtype=np.int64), "X/a": np.ones(2)})
    assert not (tmp_path / "segments").exists()


def test_a_taken_or_empty_method_is_refused():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Permutation(KindManifest):
        method: ClassVar[str] = "permutation"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Empty(KindManifest):
        pass

    for cls in (Permutation, Empty):
        with pytest.raises(ValueError, match="is taken"):
            register_manifest(cls)
    assert register_manifest(ToyManifest) is ToyManifest  # the same class again: a no-op
