"""Seeds for a run's random streams, every one derived from --seed.

Each child gets its own seed from (--seed, its name, the run's start frame, its
restart count, its torchrun rank), which its torch sampling and envs draw from. So
runs with different seeds differ in everything random (forked children would
otherwise share the process server's generator), a resumed run or restarted worker
meets fresh episodes, and ranks add experience rather than copies. Initial weights
use --seed alone, so every rank builds the same ones. SeedSequence hashes its inputs,
so neighbouring inputs give unrelated seeds; seeds fit in 31 bits for C engines.
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
    """The seed of child `name` started for the `incarnation`-th time (0 first) on
    `rank`, in a run of `run_seed` starting at env frame `start_frames`. Rank 0 gets
    what a run without torchrun gets."""
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
    """The seed of how many steps --decorrelate_envs takes into the first episode: a
    stream apart from the env's own, which its random actions come from."""
    return derive_seed(seed_of_env, 2)
