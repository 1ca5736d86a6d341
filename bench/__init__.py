"""Benchmarks: `make bench` measures the functions side by side with a no-op baseline and reports ratios."""
