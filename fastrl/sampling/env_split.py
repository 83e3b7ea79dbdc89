"""One env split inside a rollout worker: steps its envs, writes every transition
straight into a trajectory buffer, and handles episode ends and env failures. The
agents of a multi-agent game step in two halves: `send` gives each its action and
`receive` waits once every split of the step group has sent."""
from __future__ import annotations

import math
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from fastrl.algo.distributions import ACTION_MASK_KEY, random_allowed_action
from fastrl.plumbing.seeding import episode_seed, steps_into_episode_seed


class EnvFailedError(RuntimeError):
    """An env kept raising; the message names it and carries its traceback."""


class ObservationMismatchError(ValueError):
    """An env's observation that does not fit its observation_space's buffers."""


def check_observation(obs, views: dict, where: str) -> None:
    """Refuse an observation whose shape or dtype does not fit the buffers `views`
    ({key: [buffers, T+1, envs, *shape]}), as written by SplitEnvs._write_obs: numpy would
    broadcast a wrong shape into them or cast a float to integers without a word."""
    parts = {"obs": obs} if len(views) == 1 and "obs" in views else obs
    for key, view in views.items():
        named = "" if len(views) == 1 else f"[{key!r}]"
        if not isinstance(parts, dict) or key not in parts:
            raise ObservationMismatchError(f"{where} returned an observation without the key {key!r} its "
                                           "observation_space promises; make its observations match its space.")
        value = np.asarray(parts[key])
        expected = view.shape[3:]
        # Numbers into float storage, integers and bools into integer or bool storage (a mask's int8 1s).
        fits = value.dtype.kind in "biu" or (value.dtype.kind == "f" and view.dtype.kind == "f")
        if value.shape != expected or not fits:
            raise ObservationMismatchError(
                f"{where} returned an observation{named} of shape {value.shape} and dtype {value.dtype}, where its "
                f"observation_space promises shape {expected} and dtype {view.dtype}; make them match.")


def make_match_agents(spec, env_options: dict, seeds: list, agents: int, splits: int,
                      on_env_made=lambda: None, threads: int = 1) -> list:
    """The envs of a worker whose games each hold `agents` learning agents, in
    make_envs' split-major order: split s holds agent s % agents of each game of
    step group s // agents, and a game takes its first agent's seed."""
    n = len(seeds) // splits
    games = [(g, i) for g in range(splits // agents) for i in range(n)]
    envs = [None] * len(seeds)

    def slot(g: int, a: int, i: int) -> int:
        return (g * agents + a) * n + i

    def make(game):
        g, i = game
        made = spec.make_match(seed=seeds[slot(g, 0, i)], agents=agents, **env_options)
        for a, env in enumerate(made):
            envs[slot(g, a, i)] = env
        on_env_made()

    try:
        _first_alone_then_together(make, games, threads, "make-match")
    except BaseException:
        close_envs([env for env in envs if env is not None])
        raise
    return envs


def make_envs(spec, env_options: dict, seeds: list, on_env_made=lambda: None, threads: int = 1) -> list:
    """One env of `spec` per seed, in order, calling on_env_made after each (slow
    envs' starts are progress, not a hang); on a failure the others are closed.

    With threads > 1 (where spec.parallel_make allows) all but the first are made
    in parallel, as an engine's start is mostly waiting. The first is made alone on
    the calling thread: it does the one-time setup the others would queue behind,
    and what only the main thread may do (signal hooks)."""
    envs = []

    def make(seed):
        env = spec.make(seed=seed, **env_options)
        envs.append(env)  # for closing on failure; the order is the futures'
        on_env_made()
        return env

    try:
        return _first_alone_then_together(make, seeds, threads if spec.parallel_make else 1, "make-env")
    except BaseException:
        close_envs(envs)
        raise


def _first_alone_then_together(make, keys: list, threads: int, name: str) -> list:
    """[make(key) for key in keys]; with threads > 1, the first alone and the rest
    `threads` at a time (make_envs says why)."""
    if threads < 2 or len(keys) < 3:
        return [make(key) for key in keys]
    first = make(keys[0])
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name) as pool:
        rest = [pool.submit(make, key) for key in keys[1:]]
    return [first] + [future.result() for future in rest]


def close_envs(envs: list) -> None:
    """Close every env, whatever one of them raises on the way."""
    for env in envs:
        try:
            env.close()
        except Exception:
            pass


# Cap on --decorrelate_envs' random steps into an episode: a batch sees no more spread
# past it, and start-up cost grows with it.
MAX_STEPS_INTO_EPISODE = 1000


class SplitOptions(NamedTuple):
    """How a split treats its envs: how many failures in a row restart one,
    `on_restart` called once a restart is counted (before the replacement is made),
    and `decorrelate`: reset_all first moves each time-limited env a random way into
    its episode, calling `on_progress` after each."""
    max_consecutive_failures: int = 3
    on_restart: Optional[Callable[[], None]] = None
    decorrelate: bool = False
    on_progress: Callable[[], None] = lambda: None


class SplitEnvs:
    """The envs of one split and their per-episode bookkeeping. Writes go through
    numpy views of the shared tensors, as torch indexing per row would dominate
    cheap envs."""

    def __init__(self, spec, env_options: dict, seeds: list, envs: list, np_views: dict, action_spec,
                 options: Optional[SplitOptions] = None):
        """`envs`: made by make_envs from `seeds`; a failed env is remade from its seed."""
        max_consecutive_failures, on_restart, decorrelate, on_progress = options or SplitOptions()
        self._spec = spec
        self._options = env_options
        self._seeds = list(seeds)
        self._v = np_views
        self._action_spec = action_spec
        self._max_failures = max_consecutive_failures
        self.n = len(seeds)
        self.envs = list(envs)
        self.episode_return = [0.0] * self.n
        self.episode_length = [0] * self.n
        self._last_obs = [None] * self.n
        self._failures = [0] * self.n
        self._resets = [0] * self.n
        self.finished = []  # (return, length, true_objective) of episodes ended since last drained
        self.restarts = 0
        self._on_restart = on_restart
        self._decorrelate = decorrelate
        self._on_progress = on_progress
        self._cut_in = [False] * self.n  # the episode began before recording did: not counted when it ends
        self._two_halves = bool(self.envs) and hasattr(self.envs[0], "step_send")
        self._first_step = True  # its observations are checked against the buffers (check_observation)

    def _make(self, i: int):
        return self._spec.make(seed=self._seeds[i], **self._options)

    def _next_seed(self, i: int) -> int:
        # Each episode's own seed, derived from the env's: reproducible and unrelated.
        self._resets[i] += 1
        return episode_seed(self._seeds[i], self._resets[i])

    def close(self) -> None:
        close_envs(self.envs)

    def _write_obs(self, views: dict, index: tuple, obs) -> None:
        if len(views) == 1 and "obs" in views:
            views["obs"][index] = obs
        else:
            for key, view in views.items():
                view[index] = obs[key]

    def reset_all(self, buf: int, t: int) -> None:
        """Reset every env and write the first observations at [buf, t]."""
        for i in range(self.n):
            obs = self._reset_env(i)
            if self._decorrelate and not self._two_halves:
                obs = self._step_into_episode(i, obs)
                self._on_progress()
            check_observation(obs, self._v["obs"], f"Env {i} of this worker ({self._spec.name}) on reset")
            self._write_obs(self._v["obs"], (buf, t, i), obs)
            self._v["episode_start"][buf, t, i] = True
        self._check_masks(buf, t)

    def _check_masks(self, buf: int, t: int) -> None:
        """Refuse an action mask at [buf, t] that allows no action: every acting path
        (local, compiled, policy workers on a GPU) reads the rows written here, and a
        fully masked row would otherwise act silently."""
        view = self._v["obs"].get(ACTION_MASK_KEY)
        if view is None:
            return
        blocked = self._action_spec.fully_masked(torch.from_numpy(view[buf, t]).reshape(self.n, -1))
        if blocked is not None:
            env, component = blocked
            raise ValueError(self._action_spec.nothing_allowed(
                f"Env {env} of this worker ({self._spec.name}) returned an observation whose {ACTION_MASK_KEY!r}",
                component))

    def _step_into_episode(self, i: int, obs):
        """Random unrecorded steps, fewer than the time limit, so that fixed-length
        episodes do not all end at the same step. The episode cut into is left out of
        the statistics, as its return is partial."""
        env = self.envs[i]
        limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
        if not limit:
            return obs
        rng = np.random.default_rng(steps_into_episode_seed(self._seeds[i]))
        steps = int(rng.integers(0, min(limit, MAX_STEPS_INTO_EPISODE)))
        try:
            for _ in range(steps):
                obs, _, term, trunc, _ = env.step(random_allowed_action(env.action_space, obs))
                if term or trunc:
                    return self._reset_env(i)  # ended on its own: a whole episode starts here
        except Exception:
            self._recreate(i, traceback.format_exc())
            return self._reset_env(i)
        self._last_obs[i] = obs
        self._cut_in[i] = steps > 0
        return obs

    def _reset_env(self, i: int):
        while True:
            try:
                obs, info = self.envs[i].reset(seed=self._next_seed(i))
                self._count_own_restart(info)
                self._last_obs[i] = obs
                return obs
            except Exception:
                self._recreate(i, traceback.format_exc())

    def _recreate(self, i: int, tb: str) -> None:
        self._failures[i] += 1
        self._count_restart()
        if self._failures[i] >= self._max_failures:
            raise EnvFailedError(
                f"env {i} of this worker ({self._spec.name}) failed {self._failures[i]} times in a row; "
                f"its last error was:\n{tb}"
            )
        if self._two_halves:
            # An agent cannot be remade alone: its game's engines restart at its next reset.
            self.envs[i].recover()
            return
        try:
            self.envs[i].close()
        except Exception:
            pass
        self.envs[i] = self._make(i)

    def _count_own_restart(self, info: dict) -> None:
        """Count the restarts an env did itself (ViZDoom reports a dead engine's
        replacement in info["env_restarts"] instead of raising)."""
        for _ in range(int(info.get("env_restarts", 0))):
            self._count_restart()

    def _count_restart(self) -> None:
        self.restarts += 1
        if self._on_restart is not None:
            self._on_restart()

    def send(self, buf: int, t: int) -> None:
        """First half of a step: multi-agent games' agents get their actions at [buf, t]."""
        if not self._two_halves:
            return
        actions = self._v["actions"][buf, t]
        to_env = self._action_spec.to_env
        for i in range(self.n):
            self.envs[i].step_send(to_env(actions[i]))

    def receive(self, buf: int, t: int) -> None:
        """Second half, or the whole step of other envs: step with the actions at [buf, t]
        and write rewards, episode ends and next observations at [buf, t+1]."""
        v = self._v
        actions = v["actions"][buf, t]
        # Gathered in lists and written as rows after the loop: per-element numpy writes
        # are slow next to a cheap env's step.
        n = self.n
        rewards, terminated, truncated, starts = [0.0] * n, [False] * n, [False] * n, [False] * n
        to_env = self._action_spec.to_env
        two_halves = self._two_halves
        for i in range(n):
            try:
                if two_halves:
                    obs, r, term, trunc, info = self.envs[i].step_receive()
                else:
                    obs, r, term, trunc, info = self.envs[i].step(to_env(actions[i]))
                # Only a step clears the count, so an env that resets but never steps
                # cannot loop forever.
                self._failures[i] = 0
                self._count_own_restart(info)
            except Exception:
                # The episode is cut where the env died: bootstrap from the last good obs.
                self._recreate(i, traceback.format_exc())
                obs, r, term, trunc, info = self._last_obs[i], 0.0, False, True, {}
            r = float(r)
            self.episode_length[i] += 1
            self.episode_return[i] += r
            rewards[i] = r
            terminated[i] = term
            truncated[i] = trunc and not term
            if term or trunc:
                if not term:
                    self._write_obs(v["final_obs"], (buf, t, i), obs)
                objective = info.get("true_objective", math.nan)
                if self._cut_in[i]:
                    self._cut_in[i] = False
                else:
                    self.finished.append((self.episode_return[i], self.episode_length[i],
                                          float(objective)))
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
                obs = self._reset_env(i)
                starts[i] = True
            else:
                self._last_obs[i] = obs
            if self._first_step:
                check_observation(obs, v["obs"], f"Env {i} of this worker ({self._spec.name}) at its first step")
            self._write_obs(v["obs"], (buf, t + 1, i), obs)
        v["rewards"][buf, t] = rewards
        v["terminated"][buf, t] = terminated
        v["truncated"][buf, t] = truncated
        v["episode_start"][buf, t + 1] = starts
        self._first_step = False
        self._check_masks(buf, t + 1)

    def drain_finished(self) -> list:
        done, self.finished = self.finished, []
        return done
