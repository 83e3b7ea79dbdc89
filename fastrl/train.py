"""`python -m fastrl.train --env ENV [options]`: train an agent with async APPO.

Imported, this module is also the Python API's `fastrl.train(cfg)`: calling it calls
fastrl.api.train (docs/python-api.md).
"""
from __future__ import annotations

import gc
import sys
import types

from fastrl import api
from fastrl.config import Config, ConfigError, check_env_and_options, parse_args
from fastrl.plumbing.files import DiskFullError
from fastrl.plumbing.proc import start_process_server, stop_process_server
from fastrl.plumbing.timeline import mark


def main(argv=None) -> int:
    mark("main entered")
    cfg, extra = parse_args(argv)
    try:
        from fastrl.plumbing.ranks import RankError, claim_cores, detect_rank

        try:
            rank = detect_rank()  # under torchrun: which rank this is; else a run of one
        except RankError as err:
            raise ConfigError(str(err)) from None
        if rank.distributed and cfg.max_restarts:
            raise ConfigError("--max_restarts restarts a run on one machine, and a rank cannot restart alone; "
                              "under torchrun give torchrun --max_restarts instead, which restarts every rank.")
        check_env_and_options(cfg, writes=rank.main)  # cheap checks first: bad input starts no process at all
        mark("config checked")
        claim_cores(rank)  # this rank's share of the machine, before any child inherits the affinity
        start_process_server()  # its imports then overlap the runner's own
        mark("process server started")
        import torch

        torch.set_num_threads(1)  # the runner only watches; compute belongs to the children
        mark("torch imported")
        from fastrl.runtime.runner import train

        mark("runner imported")
        # Imports live as long as the process: frozen, the collector (and the exit) skips them.
        gc.freeze()

        return train(cfg, extra.explicit, rank)
    except ConfigError as err:  # raised before any worker starts (the monitor opens first)
        stop_process_server()
        print(f"fastrl: error: {err}", file=sys.stderr)
        return 2
    except DiskFullError as err:  # config.json or plan.json at start-up
        stop_process_server()
        print(f"fastrl: error: {err}.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the run loop took over signals: nothing to save yet
        stop_process_server()
        print("fastrl: interrupted during start-up; nothing was trained.", file=sys.stderr)
        return 130


class _CallableModule(types.ModuleType):
    """Importing fastrl.train sets the attribute `train` of the package to this module,
    whatever fastrl/__init__.py put there; so the module itself is the function: fastrl.train(cfg)
    calls fastrl.api.train both before and after anything imports fastrl.train."""

    def __call__(self, cfg: Config, *, echo: bool = True) -> api.TrainSummary:
        return api.train(cfg, echo=echo)

    __call__.__doc__ = api.train.__doc__


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
