"""The learner's copy of a batch out of the trajectory buffers, on this CPU.

    python benchmarks/batch_gather.py [--envs doom_battle CartPole-v1] [--seconds 5]

For each env, buffers of the trainer's layout (rollout 32, --envs_per_split envs,
observations as the env gives them, channels-last for images) filled with random
values, and the buffers of one 1024-sample batch gathered, on one thread as the
learner runs, two ways in interleaved rounds (one call of each per round, so a
busy second slows both alike):
- `TrajectoryBuffers.gather`: one copy per buffer into the batch, whole rows of
  every env end to end;
- the way it was written before: index_select of the buffers, a transpose and a
  reshape, which copies the batch twice and walks it with strides.
Both produce the same tensors in the same layout (checked before timing). The median time of each
and their ratio, with the megabytes of observations a batch holds.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.algo.distributions import ActionSpec  # noqa: E402
from fastrl.algo.model import obs_layout  # noqa: E402
from fastrl.plumbing.buffers import TrajectoryBuffers  # noqa: E402
from fastrl.tuning.profiling import time_interleaved  # noqa: E402

ROLLOUT, BATCH = 32, 1024


def index_select_gather(b: TrajectoryBuffers, indices: list) -> dict:
    """TrajectoryBuffers.gather as it was written before (7ce4b2f): the baseline."""
    idx = torch.as_tensor(indices, dtype=torch.long)

    def take(t: torch.Tensor) -> torch.Tensor:
        x = t.index_select(0, idx).transpose(0, 1)
        return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])

    def take_obs(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 6 and t.stride(-3) == 1:
            return take(t.movedim(-3, -1)).movedim(-1, -3)
        return take(t)

    truncated = take(b.truncated)
    t_idx, col = truncated.nonzero(as_tuple=True)
    buf, env = idx[col // b.envs_per_split], col % b.envs_per_split
    final_row = torch.full(truncated.shape, -1, dtype=torch.long)
    final_row[t_idx, col] = torch.arange(t_idx.numel())
    return {"obs": {k: take_obs(v) for k, v in b.obs.items()},
            "final_obs": {k: v[buf, t_idx, env] for k, v in b.final_obs.items()}, "final_row": final_row,
            "episode_start": take(b.episode_start), "actions": take(b.actions),
            "behaviour_logp": take(b.behaviour_logp), "behaviour_value": take(b.behaviour_value),
            "policy_version": take(b.policy_version), "rewards": take(b.rewards), "terminated": take(b.terminated),
            "truncated": truncated, "rnn_state0": b.rnn_state0.index_select(0, idx).flatten(0, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["doom_battle", "CartPole-v1"])
    parser.add_argument("--seconds", type=float, default=5.0, help="timing per env (default 5)")
    parser.add_argument("--envs_per_split", type=int, nargs="+", default=[4, 16],
                        help="envs a buffer holds (a batch is 1024 / (32 x this) buffers; default 4 16)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {cpu_model()}, torch {torch.__version__}, one thread")
    for name, envs_per_split in ((e, n) for e in args.envs for n in args.envs_per_split):
        env = get_spec(name).make(seed=0)
        try:
            layout, spec = obs_layout(env.observation_space), ActionSpec.from_space(env.action_space)
        finally:
            env.close()
        per_batch = BATCH // (ROLLOUT * envs_per_split)
        buffers = TrajectoryBuffers(2 * per_batch + 1, ROLLOUT, envs_per_split, layout, spec.action_dim, spec.dtype, 0)
        for t in [*buffers.obs.values(), *buffers.final_obs.values(), buffers.rewards, buffers.actions]:
            t.copy_(torch.randint(0, 255, t.shape).to(t.dtype))
        buffers.truncated.copy_(torch.rand(buffers.truncated.shape) < 0.01)
        indices = list(range(1, 2 * per_batch + 1, 2))  # every other buffer, as a learner finds them
        now, before = buffers.gather(indices), index_select_gather(buffers, indices)
        assert now.keys() == before.keys()
        for key, value in now.items():
            pairs = [(value[k], before[key][k]) for k in value] if isinstance(value, dict) else [(value, before[key])]
            for a, b in pairs:
                assert torch.equal(a, b) and a.stride() == b.stride(), key
        timed = time_interleaved({"gather": (1, functools.partial(buffers.gather, indices)),
                                  "index_select": (1, functools.partial(index_select_gather, buffers, indices))},
                                 args.seconds).per_call
        megabytes = sum(v.numel() * v.element_size() for v in now["obs"].values()) / 1e6
        print(f"{name}, {envs_per_split} envs a buffer: a {BATCH}-sample batch ({len(indices)} buffers, "
              f"{megabytes:.1f} MB of observations): "
              f"gather {timed['gather'] * 1e3:.2f} ms, index_select {timed['index_select'] * 1e3:.2f} ms "
              f"({timed['gather'] / timed['index_select']:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
