"""Kernel evaluation service: load, check, run and time Triton candidates against KernelBench references."""
