"""The profiling protocol: local vs remote benchmark sessions, calibration, comparison."""
