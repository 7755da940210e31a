"""Dask orchestration: clusters, distributed index builds and bulk queries."""

from lshdist.cluster.sizes import register as _register_sizes

_register_sizes()  # Dask sizes lshdist's objects by their arrays (`lshdist.cluster.sizes`)
