"""Prefect tasks of the nightly NDVI raster job (synthetic Sentinel-2-like data)."""
