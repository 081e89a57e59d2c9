"""Entry point for ``python -m study``."""

from __future__ import annotations

import sys

from study.cli import main

if __name__ == "__main__":
    sys.exit(main())
