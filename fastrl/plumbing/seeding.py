"""Seeds for a run's random streams, every one derived from --seed.

Each child process gets a seed of its own from (--seed, its name, the env frame the
run starts from, how many times a process of that name was started, its torchrun
rank); inside it, torch's sampling and every env's episodes draw from that seed.
Hence:

- runs with the same --seed start alike, and runs with different seeds differ in
  everything random: the action noise too, not only the envs and the initial weights.
  Without this, every child forked from the process server inherits the server's
  torch generator, so all rollout workers sampled actions from one and the same
  stream, whatever --seed said;
- a run resumed from a checkpoint, or a rollout worker restarted after a crash,
  goes on with fresh episodes and fresh noise instead of replaying the ones its
  predecessor had;
- the ranks of a torchrun launch (fastrl.plumbing.ranks) step different episodes:
  each rank's children draw from seeds of their own, rank 0's being those of a run
  of one, so that adding ranks adds experience rather than copies of it. The
  initial weights are not among them: the runner seeds those with --seed alone, so
  every rank builds the same ones (and the learners start from rank 0's all the same).

numpy's SeedSequence hashes its inputs, so neighbouring inputs (seed 0 and 1, env 5
and 6) give unrelated seeds rather than overlapping ranges of them.
Seeds fit in 31 bits: some envs hand theirs to a C engine that takes an int.
"""
from __future__ import annotations

import zlib

import numpy as np

SEED_BITS = 31


def derive_seed(parent: int, *keys: int) -> int:
    """A seed in [0, 2**31) determined by `parent` and `keys` (non-negative ints):
    equal inputs give equal seeds, any other input an unrelated one."""
    if any(k < 0 for k in keys):
        raise ValueError(f"derive_seed: keys must not be negative, got {keys}")
    # --seed is checked to lie in [0, 2**31), but a parent may be any int: fold it into SeedSequence's range.
    state = np.random.SeedSequence(parent % 2**64, spawn_key=keys).generate_state(1, np.uint32)
    return int(state[0]) >> (32 - SEED_BITS)


def process_seed(run_seed: int, name: str, start_frames: int, incarnation: int, rank: int = 0) -> int:
    """The seed of child process `name` ("rollout-worker 3") started for the
    `incarnation`-th time (0 first) on torchrun rank `rank` in a run of --seed
    `run_seed` that starts (or resumes) at env frame `start_frames`. Rank 0 takes the
    seeds a run without torchrun takes."""
    keys = (zlib.crc32(name.encode()), start_frames, incarnation) + ((rank,) if rank else ())
    return derive_seed(run_seed, *keys)


def env_seed(worker_seed: int, env_index: int) -> int:
    """The seed an env is made with: `env_index` is its place among its worker's envs."""
    return derive_seed(worker_seed, 0, env_index)


def episode_seed(seed_of_env: int, episode: int) -> int:
    """The seed the `episode`-th reset (1, 2, ...) of the env made with `seed_of_env`
    passes to env.reset()."""
    return derive_seed(seed_of_env, 1, episode)


def steps_into_episode_seed(seed_of_env: int) -> int:
    """The seed of the number of steps the env made with `seed_of_env` takes into its
    first episode (--decorrelate_envs): a stream of its own, not the one the env's
    action space samples the steps' random actions from (seeded with `seed_of_env`)."""
    return derive_seed(seed_of_env, 2)
