"""Dask orchestration: clusters, distributed index builds and bulk queries."""

# distributed registers its config defaults when first imported; a first import inside a
# `dask.config.set(...)` block (ours set distributed.* keys) loses every one of them when the
# block exits (dask restores the "distributed" key it found absent), and the next LocalCluster
# fails with KeyError: 'comm'.  The parser no longer imports Dask, so the import is made here.
import distributed  # noqa: F401

from lshdist.cluster.sizes import register as _register_sizes

_register_sizes()  # Dask sizes lshdist's objects by their arrays (`lshdist.cluster.sizes`)
