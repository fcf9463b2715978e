"""``python -m torch_ktmoe ...``: the command line (:mod:`torch_ktmoe.cli`)."""
import sys

from torch_ktmoe.cli import main

if __name__ == "__main__":
    sys.exit(main())
