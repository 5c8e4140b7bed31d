"""Benchmarks: `make bench` (python -m bench). Ratios are measured side by side in one run."""
