"""Tiny but realistic models and checkpoints, for ``gguf-mtp demo``, the tests and the benchmarks."""
