"""memsave's benchmark harness: models (``benchmarks.models``), the strategy registry (``benchmarks.strategies``) and
the runner (``python3 benchmarks/run.py``, see benchmarks/README.md). Not part of the installed package."""
