"""`python -m short_window_train ARGS`: fastrl.train with the layout memory's
minimum window cut to a few seconds, so that tests' short runs can be judged by it."""
import sys

from fastrl.train import main
from fastrl.tuning import layout_memory

if __name__ == "__main__":
    layout_memory.MIN_WINDOW_S = 3.0
    sys.exit(main(sys.argv[1:]))
