"""The index kinds `lshdist.cluster.driver` runs, and how a job finds its kind.

Built in: the permutation index (`lshdist.cluster.pipeline`), the hyperplane index
(`lshdist.cluster.hyperplane`) and the subspace index (`lshdist.cluster.subspace_query`).  A
plug-in kind is one module: a class with the methods of `lshdist.cluster.driver.IndexKind`
and a `lshdist.store.manifest.KindManifest` subclass for its manifest, registered here with
`register` (from Python) or through the entry point group ``lshdist.index_kinds`` of an
installed package (the entry point names an object with those methods; it is loaded on the
first lookup).  A build finds its kind by its configuration (`for_build`), a query by the
index's manifest (`for_index`); nothing else in lshdist names a kind.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from lshdist.cluster.driver import IndexKind
from lshdist.cluster.hyperplane import HYPERPLANE
from lshdist.cluster.pipeline import PERMUTATION
from lshdist.cluster.subspace_query import SUBSPACE
from lshdist.config import IndexConfig
from lshdist.errors import InputError
from lshdist.store.index import read_index_manifest
from lshdist.store.manifest import IndexManifest, KindManifest, register_manifest

log = logging.getLogger(__name__)

#: entry point group of plug-in index kinds
ENTRY_POINTS = "lshdist.index_kinds"

# the hyperplane kind first: a --family build is a hyperplane index whatever --method says
_KINDS: list[IndexKind] = [HYPERPLANE, PERMUTATION, SUBSPACE]
_loaded = False


def register(kind: IndexKind, manifest: type[KindManifest] | None = None) -> IndexKind:
    """Add ``kind`` (and its manifest class, so that the store reads and writes its indexes);
    a kind of the same name is replaced.  Returns ``kind``."""
    if manifest is not None:
        if manifest.method != kind.name:
            raise ValueError(f"kind {kind.name!r} registered with the manifest of "
                             f"{manifest.method!r}")
        register_manifest(manifest)
    _KINDS[:] = [k for k in _KINDS if k.name != kind.name] + [kind]
    return kind


def _plugins() -> None:
    """Register the installed entry points' kinds, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plug-in must not stop the built-in kinds
            log.warning("index kind plug-in %r cannot be loaded (%s): skipped", ep.value, exc)
            continue
        register(obj, getattr(obj, "manifest", None))


def kinds() -> list[IndexKind]:
    """Every registered kind, built-in first."""
    _plugins()
    return list(_KINDS)


def for_build(cfg: IndexConfig) -> IndexKind:
    """The kind a build with ``cfg`` makes."""
    for kind in kinds():
        if kind.chooses(cfg):
            return kind
    plugins = [k.name for k in kinds() if k.name not in ("permutation", "hyperplane", "subspace")]
    raise InputError(f"--method {cfg.method}: not an index kind of this lshdist (permutation, "
                     f"subspace; plug-in kinds installed: {', '.join(plugins) or 'none'}); "
                     f"install the plug-in that adds it, or give --method permutation")


def for_manifest(manifest: IndexManifest, index: str) -> IndexKind:
    """The kind that answers queries of ``manifest`` (of index ``index``)."""
    for kind in kinds():
        if kind.answers(manifest):
            return kind
    raise InputError(f"index {index!r} is a {manifest.method} index, which no registered "
                     "index kind answers; install its plug-in")


def for_index(index: str) -> IndexKind:
    """The kind of the index at ``index`` (its manifest read and verified)."""
    _plugins()  # a plug-in's manifests are readable only once it is registered
    return for_manifest(read_index_manifest(index), index)
