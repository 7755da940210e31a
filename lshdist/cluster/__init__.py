"""Dask orchestration: clusters, distributed index builds and bulk queries."""
