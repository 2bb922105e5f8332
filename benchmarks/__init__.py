"""Benchmarks run by hand or by make targets (not part of the test suite)."""
