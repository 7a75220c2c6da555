"""pgwork's benchmark suite, run as ``python -m bench`` from the repository root.

See ``docs/performance.md`` for what it measures and the latest numbers.
"""
