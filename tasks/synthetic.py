"""A deterministic synthetic Sentinel-2-like cube: red and NIR bands over N dates.

It stands in for the scenes a catalogue search returns to the nightly job. Every chunk is
generated from ``(seed, acquisition date, tile origin)`` only, so the same spec gives the same cube
wherever and in whatever order its chunks run. Vegetation follows a smooth spatial pattern and a
seasonal cycle; clouds are blobs of NaN (cloud gaps) in both bands.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

BANDS = ("red", "nir")
LAST_DATE = "2026-11-28"
REVISIT_DAYS = 5


@dataclass(frozen=True)
class CubeSpec:
    """Shape and content of a synthetic cube.

    Parameters
    ----------
    dates
        Number of acquisition dates (scenes).
    size
        Height and width in pixels.
    tile
        Spatial chunk edge in pixels (one Dask chunk per scene and tile).
    seed
        Random seed; the same spec always gives the same cube.
    cloud_cover
        Mean fraction of cloudy (NaN) pixels per scene.
    """

    dates: int
    size: int
    tile: int
    seed: int = 20260301
    cloud_cover: float = 0.3

    def __post_init__(self) -> None:
        for field in ("dates", "size", "tile"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")
        if not 0.0 <= self.cloud_cover < 1.0:
            raise ValueError(f"cloud_cover must be in [0, 1), got {self.cloud_cover!r}")

    @property
    def token(self) -> str:
        """A short stable identifier of the spec (used to name stored cubes)."""
        text = ",".join(f"{k}={v}" for k, v in sorted(asdict(self).items()))
        return hashlib.sha256(text.encode()).hexdigest()[:10]


def acquisition_dates(n: int) -> pd.DatetimeIndex:
    """The ``n`` latest acquisition dates, one revisit (5 days) apart, ending at LAST_DATE.

    A longer catalogue holds the same scenes as a shorter one, plus older ones.
    """
    return pd.date_range(end=LAST_DATE, periods=n, freq=f"{REVISIT_DAYS}D")


def _rng(seed: int, *parts: int) -> np.random.Generator:
    return np.random.default_rng([seed, *parts])


def _blocky_field(rng: np.random.Generator, shape: tuple[int, int], cell: int) -> np.ndarray:
    """Uniform noise (0..1) drawn on a ``cell``-pixel grid and upsampled to ``shape``."""
    coarse = rng.random((shape[0] // cell + 1, shape[1] // cell + 1), dtype="float32")
    return coarse.repeat(cell, axis=0).repeat(cell, axis=1)[: shape[0], : shape[1]]


def _vegetation(spec: CubeSpec, y0: int, x0: int, ny: int, nx: int) -> np.ndarray:
    """Vegetation fraction (0..1): a smooth global pattern, so tiles join seamlessly."""
    y = (np.arange(y0, y0 + ny) / spec.size)[:, None]
    x = (np.arange(x0, x0 + nx) / spec.size)[None, :]
    pattern = 0.5 + 0.25 * np.sin(2 * np.pi * 3 * x) * np.cos(2 * np.pi * 2 * y)
    pattern = pattern + 0.2 * np.sin(2 * np.pi * (5 * x + 4 * y))
    return np.clip(pattern, 0.0, 1.0)


def _season(day: int) -> float:
    """Phenology: greenness by day of year (low in late winter, peak in late summer)."""
    return 0.35 + 0.65 * np.sin(np.pi * ((day - 60) % 365) / 365) ** 2


def scene_tile(spec: CubeSpec, day: int, y0: int, x0: int, ny: int, nx: int) -> np.ndarray:
    """Red and NIR reflectance of one scene tile, shape ``(2, ny, nx)``, float32.

    ``day`` is the acquisition date as days since 1970-01-01: the scene depends on the date,
    not on its position in the catalogue.
    """
    rng = _rng(spec.seed, day, y0, x0)
    doy = int(pd.Timestamp(day, unit="D").day_of_year)
    veg = (_vegetation(spec, y0, x0, ny, nx) * _season(doy)).astype("float32")
    ndvi = 0.05 + 0.8 * veg
    nir = 0.25 + 0.2 * veg + 0.01 * rng.standard_normal((ny, nx), dtype="float32")
    red = nir * (1.0 - ndvi) / (1.0 + ndvi)
    red += 0.005 * rng.standard_normal((ny, nx), dtype="float32")
    out = np.stack([red, nir])
    cover = spec.cloud_cover * 2 * rng.random() if spec.cloud_cover else 0.0
    clouds = _blocky_field(rng, (ny, nx), cell=16) < cover
    out[:, clouds] = np.nan
    return out


def _block(spec: CubeSpec, block_info=None) -> np.ndarray:
    (_, _), (t0, t1), (y0, y1), (x0, x1) = block_info[None]["array-location"]
    days = _days(acquisition_dates(spec.dates)[t0:t1])
    out = np.empty((2, t1 - t0, y1 - y0, x1 - x0), dtype="float32")
    for i, day in enumerate(days):
        out[:, i] = scene_tile(spec, day, y0, x0, y1 - y0, x1 - x0)
    return out


def _days(dates: pd.DatetimeIndex) -> list[int]:
    return [int((d - pd.Timestamp("1970-01-01")) / pd.Timedelta(days=1)) for d in dates]


def synthetic_cube(spec: CubeSpec) -> xr.Dataset:
    """The lazy (Dask-backed) synthetic cube, chunked one scene by one tile per chunk.

    Returns
    -------
    A Dataset with float32 variables ``red`` and ``nir`` on ``(time, y, x)``.
    """
    shape = (len(BANDS), spec.dates, spec.size, spec.size)
    chunks = da.core.normalize_chunks((len(BANDS), 1, spec.tile, spec.tile), shape)
    scenes = da.map_blocks(_block, spec, dtype="float32", chunks=chunks,
                           name=f"synthetic_scene-{spec.token}")
    coords = {"time": acquisition_dates(spec.dates),
              "y": np.arange(spec.size, dtype="float64") * -10.0,
              "x": np.arange(spec.size, dtype="float64") * 10.0}
    dims = ("time", "y", "x")
    ds = xr.Dataset({name: (dims, scenes[i]) for i, name in enumerate(BANDS)},
                    coords=coords)
    ds.attrs.update({"title": "synthetic Sentinel-2-like reflectance", "spec": spec.token,
                     **{f"spec_{k}": v for k, v in asdict(spec).items()}})
    return ds
