"""The benchmark suite behind ``benchmarks/bench_suite.py`` (issue #3, point 3)."""
