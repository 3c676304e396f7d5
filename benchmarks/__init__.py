"""hpcevo benchmarks: `python -m benchmarks` runs the performance suite (see perf_suite.py)."""
