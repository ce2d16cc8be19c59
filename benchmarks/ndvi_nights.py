"""Stored nights of the reference flow: the nightly NDVI flow run N times into one store.

Each night is a real run of :func:`flows.nightly_ndvi.nightly_ndvi` (its own process
cluster of 2 workers, scenes read through GDAL from a local data folder, four stages:
read, ndvi, reduce, write; the first night also ``prepare``s the scene archive) against one
real Prefect server on 127.0.0.1, profiled and stored as any night is. The store then holds
what :mod:`benchmarks.eta_accuracy` ``--store`` replays the ETA on.

Run: ``PYTHONPATH=. python benchmarks/ndvi_nights.py --store PATH [--nights 10]
[--size tiny] [--data-url PATH]`` (tiny: about 20 s a night here).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the run store to write the nights to")
    parser.add_argument("--nights", type=int, default=10)
    parser.add_argument("--size", default="tiny", choices=("tiny", "small", "large"))
    parser.add_argument("--data-url", default="",
                        help="where the scenes live (default: a new temporary folder)")
    args = parser.parse_args()
    if args.nights < 1:
        parser.error(f"--nights must be >= 1, got {args.nights}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on `timeout`

    from helpers.prefect_server import running_server, use_server

    from flows.nightly_ndvi import nightly_ndvi

    with tempfile.TemporaryDirectory() as scratch, running_server(ui=False) as server, \
            use_server(server):
        data = args.data_url or str(Path(scratch) / "data")
        for night in range(1, args.nights + 1):
            t0 = time.perf_counter()
            state = nightly_ndvi(size=args.size, store=args.store, data_url=data,
                                 return_state=True)
            print(f"night {night}/{args.nights}: {state.name} in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
