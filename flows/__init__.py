"""Example flows: the nightly NDVI job profiled per stage, and the ``make demo`` driver."""
