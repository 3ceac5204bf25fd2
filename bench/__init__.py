"""The benchmark suite: `python -m bench.run [--quick] [--only NAME,...]` (see bench/README.md)."""
