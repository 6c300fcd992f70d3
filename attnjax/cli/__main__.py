"""``python -m attnjax.cli ARGS``: the command line, as the ``attnjax`` script runs it."""

import sys

from attnjax.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
