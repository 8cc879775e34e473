"""Benchmarks (never timed unit tests). `make bench` runs every bench_*.py here."""
