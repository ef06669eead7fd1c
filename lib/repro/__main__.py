"""``python -m repro``: see :mod:`repro.tools.cli`."""

import sys

from repro.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
