"""DoomMatch: several learning agents in one ViZDoom network game on 127.0.0.1.

    agents = DoomMatch("doom_duel", seed=1, agents=2).agents   # one env per player
    for env in agents: env.step_send(action_of(env))            # every agent acts...
    results = [env.step_receive() for env in agents]             # ...then all have stepped

Each seat is a DoomEnv on its own thread (seat 0 hosts): a network game moves only
when every player does, so seats run each tic together. The two-half step lets a
rollout worker give every agent its action before waiting on any. Seats reset
together and their episodes end on the same step; one that ends alone (a dead engine)
ends the others' too, and a dead engine takes the others' with it rather than leave
them waiting. The next reset restarts every engine on a new port.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import gymnasium as gym
from fastrl.envs.doom import net_yield
from fastrl.envs.doom.doom_env import DEFAULT_HANG_TIMEOUT_S, INIT_ATTEMPTS, DoomEnv
from fastrl.envs.doom.scenarios import ENGINE_RECYCLE_EPISODES, get_scenario

# Seconds a seat's engine waits for the others to connect, host and joiners alike.
CONNECT_TIMEOUT_S = 30.0


def free_udp_port() -> int:
    """A free UDP port on 127.0.0.1; if another program takes it first, the host fails
    and the match starts again on another port."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Seat:
    """A player's place in a match; port and tic barrier are read live, as a restart
    replaces them."""

    def __init__(self, match: "DoomMatch", index: int):
        self._match = match
        self.index = index
        self.players = match.num_agents
        self.connect_timeout = CONNECT_TIMEOUT_S

    @property
    def port(self) -> int:
        return self._match.port

    @property
    def tic_barrier(self) -> threading.Barrier:
        return self._match.tic_barrier


class DoomMatch:
    def __init__(self, scenario: str, seed: int | None = None, agents: int | None = None,
                 engine_recycle_episodes: int = ENGINE_RECYCLE_EPISODES, **doom_kwargs):
        """agents: learning agents in the game (default: the scenario's). Every engine
        is recycled after engine_recycle_episodes (0: never), all at once.
        doom_kwargs: DoomEnv's other options, the same for every seat."""
        self.scenario = get_scenario(scenario)
        if not self.scenario.deathmatch:
            raise ValueError(f"{self.scenario.name} is not a deathmatch scenario; several agents play only in those "
                             "(doom_duel, doom_deathmatch)")
        self.num_agents = int(self.scenario.agents if agents is None else agents)
        if self.num_agents < 1:
            raise ValueError(f"a match needs at least one agent, not {self.num_agents}")
        if int(engine_recycle_episodes) < 0:
            raise ValueError(f"engine_recycle_episodes must be 0 (never) or a positive count, "
                             f"not {engine_recycle_episodes}")
        self.engine_recycle_episodes = int(engine_recycle_episodes)
        self.engine_recycles = 0
        self._episodes_on_engines = 0
        self.hang_timeout = float(doom_kwargs.get("hang_timeout", DEFAULT_HANG_TIMEOUT_S))
        net_yield.offer_to_engines()
        self.port = free_udp_port()
        self.tic_barrier = threading.Barrier(self.num_agents)
        self._pool = ThreadPoolExecutor(max_workers=self.num_agents, thread_name_prefix="doom-seat")
        self._closed = False
        self._actions: list = [None] * self.num_agents
        self._sent = 0
        self._stepping: list | None = None  # the seats' step futures, once every agent has sent
        self._results: list | None = None
        self._received = 0
        self._fresh: list | None = None  # the seats' (obs, info) of a reset not every agent has taken
        self._taken = 0
        seats = [Seat(self, i) for i in range(self.num_agents)]
        seeds = [None if seed is None else seed + i for i in range(self.num_agents)]
        try:
            self.players = self._each(lambda i: DoomEnv(self.scenario, seeds[i], seat=seats[i],
                                                         engine_recycle_episodes=0, **doom_kwargs))
        except BaseException:
            self._pool.shutdown(wait=False)
            raise
        self.agents = [DoomAgentEnv(self, i) for i in range(self.num_agents)]

    def _each(self, fn) -> list:
        """fn(i) for every seat at once; the first error is raised once all returned,
        the other seats' envs closed."""
        futures = [self._pool.submit(fn, i) for i in range(self.num_agents)]
        results, error = [], None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as err:  # noqa: BLE001 - raised below, after every seat has returned
                error = error or err
                results.append(None)
        if error is not None:
            for r in results:
                if isinstance(r, DoomEnv):
                    r.close()
            raise error
        return results

    # -- stepping ----------------------------------------------------------------------
    def send(self, agent: int, action) -> None:
        if self._stepping is not None or self._actions[agent] is not None:
            raise RuntimeError(f"agent {agent} sent a second action before every agent of its match "
                               "received its step; call step_receive on each first")
        self._actions[agent] = action
        self._sent += 1
        if self._sent == self.num_agents:
            self._stepping = [self._pool.submit(p.step, a) for p, a in zip(self.players, self._actions)]
            self._actions = [None] * self.num_agents
            self._sent = 0

    def receive(self, agent: int):
        if self._results is None:
            if self._stepping is None:
                raise RuntimeError(f"agent {agent}'s step waits for the other agents of its match: call step_send "
                                   "on every agent, then step_receive")
            futures, self._stepping = self._stepping, None
            try:
                self._results = self._collect(futures)
            except Exception as err:  # noqa: BLE001 - a seat's step raised: every agent's receive raises it
                self._results = [err] * self.num_agents
        result = self._results[agent]
        self._received += 1
        if self._received == self.num_agents:
            self._results, self._received = None, 0
        if isinstance(result, Exception):
            raise result
        return result

    def _collect(self, futures: list) -> list:
        """The seats' step results. A dead engine ends the others' at once; an episode
        that ended alone ends everyone's."""
        pending = set(futures)
        broken = False
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            if not broken and pending and any(p.game is None for p in self.players):
                self._kill_engines()  # their seats wait on the dead one's tics: free them now
                broken = True
        results = [f.result() for f in futures]
        ended = [term or trunc for _, _, term, trunc, _ in results]
        if any(ended) and not all(ended):
            for i, (obs, reward, _, _, info) in enumerate(results):
                if not ended[i]:
                    player = self.players[i]
                    player.end_engine()
                    results[i] = (obs, reward, False, True, {**info, "true_objective": player.objective_so_far()})
        return results

    def _kill_engines(self) -> None:
        self.tic_barrier.abort()
        for p in self.players:
            pid = p.engine_pid
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # -- episodes ----------------------------------------------------------------------
    def reset(self, agent: int, seed: int | None):
        """Agent `agent`'s first observation of the next episode; the first agent to ask
        resets every seat (seat i with seed + i)."""
        if self._fresh is None:
            self._fresh = self._reset_all(seed)
        obs, info = self._fresh[agent]
        self._fresh[agent] = (obs, {})  # an agent that asks twice gets no restart counted twice
        self._taken += 1
        if self._taken >= self.num_agents:
            self._fresh, self._taken = None, 0
        return obs, info

    def _reset_all(self, seed: int | None) -> list:
        recycle = 0 < self.engine_recycle_episodes <= self._episodes_on_engines
        last = None
        for _ in range(INIT_ATTEMPTS):
            if recycle or last is not None or any(p.game is None for p in self.players):
                self._restart_engines(recycle)
                recycle = False
            try:
                fresh = self._each(lambda i: self.players[i].reset(seed=None if seed is None else seed + i))
                self._episodes_on_engines += 1
                return fresh
            except RuntimeError as err:  # a seat could not start its episode: start them all again
                last = err
        raise RuntimeError(f"the {self.scenario.name} match failed to start an episode {INIT_ATTEMPTS} times; "
                           f"last error: {last}")

    def _restart_engines(self, recycled: bool) -> None:
        """End every seat's engine; the next reset starts them on a new port, as the old
        one may still be held."""
        self.end_engines()
        self.port = free_udp_port()
        self.tic_barrier = threading.Barrier(self.num_agents)
        self._episodes_on_engines = 0
        if recycled:
            self.engine_recycles += 1

    def end_engines(self) -> None:
        """End every engine now; the next reset starts them all again."""
        for p in self.players:
            p.end_engine()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._kill_engines()
        for p in self.players:
            p.close()
        self._pool.shutdown(wait=True, cancel_futures=True)


class DoomAgentEnv(gym.Env):
    """One agent of a DoomMatch as a gymnasium env: step_send, then step_receive once
    every agent has sent (step() does both, for the last one)."""

    def __init__(self, match: DoomMatch, index: int):
        self.match, self.index = match, index
        player = self.player
        self.observation_space = player.observation_space
        self.action_space = player.action_space
        self.metadata = player.metadata
        self.render_mode = player.render_mode
        self.frameskip = player.frameskip

    def step_send(self, action) -> None:
        self.match.send(self.index, action)

    def step_receive(self):
        return self.match.receive(self.index)

    def step(self, action):
        self.step_send(action)
        return self.step_receive()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return self.match.reset(self.index, seed)

    def recover(self) -> None:
        """After this env raised: every engine of its match starts again at reset."""
        self.match.end_engines()

    def render(self):
        return self.player.render()

    def close(self) -> None:
        self.match.close()

    @property
    def player(self) -> DoomEnv:
        return self.match.players[self.index]
