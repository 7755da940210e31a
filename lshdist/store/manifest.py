"""Typed index manifests: what ``index.json`` holds, as frozen dataclasses.

`lshdist.store.index` reads and validates an index's manifest once (`read_index_manifest`) and
hands out one of these; the rest of lshdist reads attributes, never keys.  One class per index
kind over a common head (`IndexManifest`: format, version, model, model_checksum, kind, d,
seed, rows):

* `PermutationManifest` -- the hashed index: b, epsilon, M, W, H, learned, its
  `SegmentEntry` list, the calibration record and the append labels (``batches``);
* `HyperplaneManifest` -- a permutation index for hyperplane queries, with its `HashFamily`;
* `SubspaceManifest` -- the subspace-partition index: its `GroupEntry` list and the
  `SubspaceRecord` (`lshdist.store.subspace`);
* `KindManifest` -- the manifest of an index kind added as a plug-in (`register_manifest`):
  the head, its `KindEntry` list and the kind's own JSON ``params``.

``to_json()`` gives the JSON that is written, key for key and in the order lshdist has always
written it: a manifest read from disk remembers its keys' order (``layout``) and keeps any key
this version does not know (``extra``), so reading and writing an index back changes nothing but
what the caller changed.  ``from_json`` trusts its input: only `lshdist.store.index` calls it,
after the checks of `read_manifest` (types, ranges, checksum).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from lshdist.index.calibrate import Calibration
from lshdist.index.subspace import Round

FORMAT = "lshdist-index"
#: 2: manifest checksum; segment names checked
VERSION = 2


def _ordered(body: dict[str, Any], extra: Mapping[str, Any], layout: Sequence[str]
             ) -> dict[str, Any]:
    """``body`` and ``extra`` with the keys of ``layout`` first, in its order (a manifest read
    from disk: the order it was written in), then the others in ``body``'s order."""
    full = {**body, **extra}
    if not layout:
        return full
    out = {k: full[k] for k in layout if k in full}
    out.update((k, v) for k, v in full.items() if k not in out)
    return out


def _extra(raw: Mapping[str, Any], known: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in known}


# ------------------------------------------------------------------------------- segments


@dataclass(frozen=True)
class SegmentPart:
    """One part of a packed segment: a segment as it was stored (``part-NNNN/``)."""

    rows: int
    permutations: int
    checksum: str

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "permutations": self.permutations, "checksum": self.checksum}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SegmentPart:
        return cls(rows=raw["rows"], permutations=raw["permutations"], checksum=raw["checksum"])


_ENTRY_KEYS = ("name", "rows", "permutations", "checksum", "parts", "source", "start", "stop")


@dataclass(frozen=True, kw_only=True)
class SegmentEntry:
    """A permutation index's segment: its directory ``name``, ``rows``, ``permutations`` (M)
    and ``checksum``; ``parts`` for a packed (compacted) segment; the row range
    ``source[start:stop]`` it was built from, where known."""

    name: str
    rows: int
    permutations: int
    checksum: str
    parts: tuple[SegmentPart, ...] | None = None
    source: str | None = None
    start: int | None = None
    stop: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    layout: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def n_parts(self) -> int:
        """Segments searched for this entry: its parts, or itself."""
        return len(self.parts) if self.parts else 1

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "rows": self.rows,
                                "permutations": self.permutations, "checksum": self.checksum}
        if self.parts is not None:
            body["parts"] = [p.to_json() for p in self.parts]
        for key in ("source", "start", "stop"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
        return _ordered(body, self.extra, self.layout)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SegmentEntry:
        parts = raw.get("parts")
        return cls(name=raw["name"], rows=raw["rows"], permutations=raw["permutations"],
                   checksum=raw["checksum"],
                   parts=None if parts is None else tuple(SegmentPart.from_json(p)
                                                          for p in parts),
                   source=raw.get("source"), start=raw.get("start"), stop=raw.get("stop"),
                   extra=_extra(raw, _ENTRY_KEYS), layout=tuple(raw))


@dataclass(frozen=True, kw_only=True)
class GroupEntry:
    """A subspace index's segment: group number ``group`` (its position), ``final`` (the
    group of the rows no round captured), its ``rows`` and ``checksum``."""

    name: str
    rows: int
    group: int
    final: bool
    checksum: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "group": self.group,
                "final": self.final, "checksum": self.checksum}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GroupEntry:
        return cls(name=raw["name"], rows=raw["rows"], group=raw["group"], final=raw["final"],
                   checksum=raw["checksum"])


@dataclass(frozen=True, kw_only=True)
class KindEntry:
    """A segment of a plug-in index kind: its name, rows and checksum
    (`lshdist.store.index.write_arrays_segment`)."""

    name: str
    rows: int
    checksum: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "checksum": self.checksum}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> KindEntry:
        return cls(name=raw["name"], rows=raw["rows"], checksum=raw["checksum"])


# --------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class HashFamily:
    """The hyperplane hash family of a hyperplane index: ``h-hash`` or ``eh-hash``, the
    EH-Hash query samples t (None: exact), and the EH-Hash definition's ``version``."""

    name: str
    samples: int | None
    version: int | None = None

    @property
    def paired(self) -> bool:
        """H-Hash keys (two bits per function)."""
        return self.name == "h-hash"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "samples": self.samples}
        if self.version is not None:
            out["version"] = self.version
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HashFamily:
        return cls(name=raw["name"], samples=raw["samples"], version=raw.get("version"))


_RECORD_KEYS = ("version", "rank", "bits", "eta", "alpha", "max_rounds", "min_group",
                "krylov_iters", "n_probe", "n_candidates", "target_recall", "rounds",
                "group_sizes", "subspaces_checksum", "router")


@dataclass(frozen=True, kw_only=True)
class SubspaceRecord:
    """A subspace index's build record (the manifest's ``subspace``): parameters, rounds,
    group sizes and the checksum of the router (the groups' bases and the centre);
    ``target_recall`` None where ``--probe`` and ``--candidates`` were fixed at the build (or,
    in indexes written before it was recorded, absent).  ``router``: the segment directory the
    router is stored in, a fresh name each build, so that a build replacing an index on
    object storage never writes over the router the old manifest names; None (absent) in
    indexes written before, whose router is ``subspaces/``."""

    version: int
    rank: int
    bits: int
    eta: float
    alpha: float | None
    max_rounds: int
    min_group: int
    krylov_iters: int
    n_probe: int
    n_candidates: int
    target_recall: float | None
    rounds: tuple[Round, ...]
    group_sizes: tuple[int, ...]
    subspaces_checksum: str
    router: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    layout: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        body = {k: getattr(self, k) for k in _RECORD_KEYS}
        body["rounds"] = [dict(vars(r)) for r in self.rounds]
        body["group_sizes"] = list(self.group_sizes)
        if self.layout and "target_recall" not in self.layout and self.target_recall is None:
            del body["target_recall"]  # as read: written before it was recorded
        if self.router is None:
            del body["router"]  # the router in ``subspaces/`` (indexes written before)
        return _ordered(body, self.extra, self.layout)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SubspaceRecord:
        plain: dict[str, Any] = {k: raw.get(k) for k in _RECORD_KEYS
                                 if k not in ("rounds", "group_sizes")}
        return cls(**plain, rounds=tuple(Round(**r) for r in raw["rounds"]),
                   group_sizes=tuple(raw["group_sizes"]), extra=_extra(raw, _RECORD_KEYS),
                   layout=tuple(raw))


# ------------------------------------------------------------------------------- manifests


@dataclass(frozen=True, kw_only=True)
class IndexManifest:
    """The head every index manifest shares: its format and version, the model it was built
    with (path and checksum), the model's kind (explicit or implicit), d, the seed and the
    rows indexed; ``checksum`` as read (`lshdist.store.index.write_manifest` computes it)."""

    #: ``permutation`` (the hashed index) or ``subspace``
    method: ClassVar[str] = ""

    model: str
    model_checksum: str
    kind: str
    d: int
    seed: int
    rows: int
    segments: tuple[SegmentEntry | GroupEntry | KindEntry, ...]
    format: str = FORMAT
    version: int = VERSION
    checksum: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    layout: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def segment_names(self) -> list[str]:
        """The segment directory names, in manifest order."""
        return [e.name for e in self.segments]

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError


_PERMUTATION_KEYS = ("format", "version", "model", "model_checksum", "kind", "d", "bits",
                     "epsilon", "permutations", "window", "hamming_keep", "seed", "learned",
                     "segments", "family", "calibration", "batches", "rows", "checksum")


@dataclass(frozen=True, kw_only=True)
class PermutationManifest(IndexManifest):
    """A hashed (permutation-list) index: b bits, epsilon or M, W, H, learned or Charikar's
    hash functions, its segments, the calibration record (`calibration`) and the labels of
    the appends that landed (``batches``, None when none was labelled)."""

    method: ClassVar[str] = "permutation"

    bits: int
    epsilon: float | None
    permutations: int | None
    window: int
    hamming_keep: int
    learned: bool
    segments: tuple[SegmentEntry, ...]
    #: the calibration record as stored (None: a build not calibrated yet)
    calibration_json: Mapping[str, Any] | None = None
    batches: tuple[str, ...] | None = None

    @functools.cached_property
    def calibration(self) -> Calibration | None:
        """The calibration record (curve and chosen operating point), parsed."""
        if self.calibration_json is None:
            return None
        return Calibration.from_json(self.calibration_json)

    def with_family(self, family: HashFamily) -> HyperplaneManifest:
        """This manifest as a hyperplane index's, keyed by ``family``."""
        return HyperplaneManifest(**{f.name: getattr(self, f.name) for f in fields(self)},
                                  family=family)

    @property
    def operating_point(self) -> tuple[int, int, int]:
        """``(M, W, H)`` the index was built at (M = 0: each segment's own lists)."""
        return (self.permutations or 0, self.window, self.hamming_keep)

    def has_batch(self, label: str | None) -> bool:
        """Whether the append labelled ``label`` landed."""
        return label is not None and label in (self.batches or ())

    def _family(self) -> HashFamily | None:
        return None

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": self.format, "version": self.version, "model": self.model,
            "model_checksum": self.model_checksum, "kind": self.kind, "d": self.d,
            "bits": self.bits, "epsilon": self.epsilon, "permutations": self.permutations,
            "window": self.window, "hamming_keep": self.hamming_keep, "seed": self.seed,
            "learned": self.learned, "segments": [e.to_json() for e in self.segments]}
        family = self._family()
        if family is not None:
            body["family"] = family.to_json()
        if self.calibration_json is not None:
            body["calibration"] = dict(self.calibration_json)
        if self.batches is not None:
            body["batches"] = list(self.batches)
        body["rows"] = self.rows
        if self.checksum is not None:
            body["checksum"] = self.checksum
        return body

    def to_json(self) -> dict[str, Any]:
        return _ordered(self._body(), self.extra, self.layout)

    @staticmethod
    def _fields(raw: Mapping[str, Any]) -> dict[str, Any]:
        batches = raw.get("batches")
        return dict(
            format=raw["format"], version=raw["version"], model=raw["model"],
            model_checksum=raw["model_checksum"], kind=raw["kind"], d=raw["d"],
            seed=raw["seed"], rows=raw["rows"], checksum=raw.get("checksum"), bits=raw["bits"],
            epsilon=raw["epsilon"], permutations=raw["permutations"], window=raw["window"],
            hamming_keep=raw["hamming_keep"], learned=raw["learned"],
            segments=tuple(SegmentEntry.from_json(e) for e in raw["segments"]),
            calibration_json=raw["calibration"],
            batches=None if batches is None else tuple(batches),
            extra=_extra(raw, _PERMUTATION_KEYS), layout=tuple(raw))


@dataclass(frozen=True, kw_only=True)
class HyperplaneManifest(PermutationManifest):
    """A permutation index for hyperplane queries (`lshdist index --family`): its keys are
    the `HashFamily`'s, its segments hold margin payloads."""

    family: HashFamily

    def _family(self) -> HashFamily | None:
        return self.family


_SUBSPACE_KEYS = ("format", "version", "method", "model", "model_checksum", "kind", "d", "seed",
                  "rows", "segments", "subspace", "checksum")


@dataclass(frozen=True, kw_only=True)
class SubspaceManifest(IndexManifest):
    """A subspace-partition index (`lshdist.store.subspace`): one `GroupEntry` per group, in
    group order, and the build's `SubspaceRecord`."""

    method: ClassVar[str] = "subspace"

    segments: tuple[GroupEntry, ...]
    subspace: SubspaceRecord

    @property
    def segment_names(self) -> list[str]:
        """The segment directory names, in manifest order, then the router's (when it is
        stored as a segment directory: `SubspaceRecord.router`)."""
        router = [self.subspace.router] if self.subspace.router is not None else []
        return [*(e.name for e in self.segments), *router]

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": self.format, "version": self.version, "method": self.method,
            "model": self.model, "model_checksum": self.model_checksum, "kind": self.kind,
            "d": self.d, "seed": self.seed, "rows": self.rows,
            "segments": [e.to_json() for e in self.segments],
            "subspace": self.subspace.to_json()}
        if self.checksum is not None:
            body["checksum"] = self.checksum
        return _ordered(body, self.extra, self.layout)


_KIND_KEYS = ("format", "version", "method", "model", "model_checksum", "kind", "d", "seed",
              "rows", "segments", "params", "checksum")


@dataclass(frozen=True, kw_only=True)
class KindManifest(IndexManifest):
    """The manifest of an index kind added as a plug-in: a subclass sets ``method`` (the
    kind's name, written to ``index.json``) and is registered with `register_manifest`; the
    store checks its head and segments like every index's (types, names, rows, checksums) and
    calls `check_params` on the kind's own ``params``."""

    segments: tuple[KindEntry, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def check_params(cls, params: Mapping[str, Any], where: str) -> None:
        """Refuse (`lshdist.errors.FormatError`, naming ``where``) params this kind cannot
        read; the default accepts any JSON object."""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": self.format, "version": self.version, "method": self.method,
            "model": self.model, "model_checksum": self.model_checksum, "kind": self.kind,
            "d": self.d, "seed": self.seed, "rows": self.rows,
            "segments": [e.to_json() for e in self.segments], "params": dict(self.params)}
        if self.checksum is not None:
            body["checksum"] = self.checksum
        return _ordered(body, self.extra, self.layout)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> KindManifest:
        return cls(format=raw["format"], version=raw["version"], model=raw["model"],
                   model_checksum=raw["model_checksum"], kind=raw["kind"], d=raw["d"],
                   seed=raw["seed"], rows=raw["rows"], checksum=raw.get("checksum"),
                   segments=tuple(KindEntry.from_json(e) for e in raw["segments"]),
                   params=dict(raw.get("params") or {}), extra=_extra(raw, _KIND_KEYS),
                   layout=tuple(raw))


#: the manifest classes of plug-in index kinds, by ``method``
_PLUGINS: dict[str, type[KindManifest]] = {}

#: the methods lshdist itself writes (a permutation index records none)
BUILT_IN = ("permutation", "subspace")


def register_manifest(cls: type[KindManifest]) -> type[KindManifest]:
    """Let the store read and write indexes of ``cls.method`` (a class decorator; registering
    the same class again is a no-op)."""
    name = cls.method
    if not name or name in BUILT_IN or _PLUGINS.get(name, cls) is not cls:
        raise ValueError(f"index kind {name!r} is taken (or empty); choose another name")
    _PLUGINS[name] = cls
    return cls


def plugin_manifest(method: Any) -> type[KindManifest] | None:
    """The registered manifest class of ``method`` (None: not a plug-in kind)."""
    return _PLUGINS.get(method) if isinstance(method, str) else None


def known_methods() -> list[str]:
    """Every index method this process reads, built-in first."""
    return [*BUILT_IN, *sorted(_PLUGINS)]


AnyManifest = PermutationManifest | SubspaceManifest | KindManifest


def manifest_from_json(raw: Mapping[str, Any]) -> AnyManifest:
    """The typed manifest of a checked ``index.json`` (see `lshdist.store.index.read_manifest`):
    a `SubspaceManifest` for ``method: "subspace"``, a registered plug-in's `KindManifest`
    for its method, a `HyperplaneManifest` for one with a ``family``, else a
    `PermutationManifest`."""
    plugin = plugin_manifest(raw.get("method"))
    if plugin is not None:
        return plugin.from_json(raw)
    if raw.get("method") == SubspaceManifest.method:
        return SubspaceManifest(
            format=raw["format"], version=raw["version"], model=raw["model"],
            model_checksum=raw["model_checksum"], kind=raw["kind"], d=raw["d"],
            seed=raw["seed"], rows=raw["rows"], checksum=raw.get("checksum"),
            segments=tuple(GroupEntry.from_json(e) for e in raw["segments"]),
            subspace=SubspaceRecord.from_json(raw["subspace"]),
            extra=_extra(raw, _SUBSPACE_KEYS), layout=tuple(raw))
    fields = PermutationManifest._fields(raw)
    if raw.get("family") is not None:
        return HyperplaneManifest(family=HashFamily.from_json(raw["family"]), **fields)
    return PermutationManifest(**fields)


def as_entry(entry: SegmentEntry | Mapping[str, Any]) -> SegmentEntry:
    """``entry`` typed (a manifest entry as JSON, from `read_manifest`: tests and tools)."""
    return entry if isinstance(entry, SegmentEntry) else SegmentEntry.from_json(entry)


def as_group_entry(entry: GroupEntry | Mapping[str, Any]) -> GroupEntry:
    """``entry`` typed (a subspace manifest entry as JSON)."""
    return entry if isinstance(entry, GroupEntry) else GroupEntry.from_json(entry)
