"""python -m mltensor.serve: the same as `mltensor serve`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m mltensor.serve"))
