"""``python -m pgwork.cli``: the same program as the ``pgwork`` script."""

from pgwork.cli import main

main()
