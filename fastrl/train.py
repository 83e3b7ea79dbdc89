"""`python -m fastrl.train --env ENV [options]`: train an agent with async APPO."""
from __future__ import annotations

import sys

from fastrl.config import ConfigError, parse_args


def main(argv=None) -> int:
    cfg, _ = parse_args(argv)
    import torch

    torch.set_num_threads(1)  # the runner only watches; compute belongs to the children
    from fastrl.runner import Runner

    try:
        runner = Runner(cfg)
    except ConfigError as err:
        print(f"fastrl: error: {err}", file=sys.stderr)
        return 2
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
