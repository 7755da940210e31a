"""Storage: Zarr datasets, models and indexes, Parquet results (ARCHITECTURE.md section 3)."""
