"""Population-based training as a run drives it: a round of fastrl.learning.pbt each
--pbt_period_env_steps per policy, handed to the learners (plumbing.hyper), logged to
pbt.jsonl and printed. A resumed run replays the log for hyperparameters; weights come
from each policy's checkpoint."""
from __future__ import annotations

import os
from typing import Callable, List, Optional

from fastrl.config import ConfigError
from fastrl.learning import pbt
from fastrl.plumbing.hyper import SharedHyper


class PopulationDriver:
    def __init__(self, cfg, hyper: SharedHyper, say: Callable[[str], None]):
        self.cfg, self.hyper, self.say = cfg, hyper, say
        self.path = os.path.join(cfg.experiment_dir, pbt.LOG_NAME)
        self.population = pbt.Population({k: getattr(cfg, k) for k in pbt.HYPERPARAMETERS}, cfg.num_policies,
                                          cfg.pbt_replace_fraction, cfg.pbt_perturb_factor, cfg.seed)
        if cfg.restart and os.path.exists(self.path):
            os.unlink(self.path)  # the population starts over with the weights
        try:
            earlier = pbt.read_log(self.path)
            self.population.replay(earlier)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if earlier:
            say(f"PBT: the population as {self.path} left it, after {self.population.rounds} rounds")
        else:
            started = self.population.start()
            pbt.append_log(self.path, started)
            for e in started:
                say(pbt.describe(e))
        for k, values in enumerate(self.population.hyper):
            hyper.set(k, values)

    def update(self, steps_per_policy: float, objectives: List[Optional[float]]) -> List[dict]:
        """Run round r once each policy has taken r periods' steps and all have an
        objective; returns its events, already handed over, logged and printed. A round
        that changed nothing left no log line, so after a resume it may run again."""
        round_ = int(steps_per_policy // self.cfg.pbt_period_env_steps)
        if round_ <= self.population.rounds or not self.population.ready(objectives):
            return []
        events = self.population.round(round_, objectives, int(steps_per_policy))
        for e in events:
            self.hyper.set(e["policy"], e["hyper"], copy_from=e["copied_from"])
            self.say(pbt.describe(e))
        pbt.append_log(self.path, events)
        return events

    def scalars(self) -> dict:
        """Each policy's hyperparameters now, for TensorBoard and W&B."""
        return {f"pbt/policy_{k}/{name}": v
                for k, hyper in enumerate(self.population.hyper) for name, v in hyper.items()}
