"""Helpers the tests (and the benchmarks that reuse their data) share; no tests here."""
