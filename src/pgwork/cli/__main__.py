"""``python -m pgwork.cli``: the same program as the ``pgwork`` script.

Guarded, so that importing this module (as a test walking the package does) runs nothing.
"""

from pgwork.cli import main

if __name__ == "__main__":
    main()
