"""lshdist: fast similarity search under learned metrics, as a distributed Dask batch job."""

__version__ = "0.1.0"
