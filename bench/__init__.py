"""Benchmark scripts and the KernelBench-sized problem corpus (bench.corpus)."""
