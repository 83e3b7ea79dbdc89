"""DoomEnv: one ViZDoom game as a gymnasium.Env, with fastrl's screen, frameskip,
action and reward wrappers built in (one object, no wrapper chain to step through).

Observation: the 160x120 RGB render resized to uint8 (3, 72, 128); with
measurements=True a Dict adding float32 (5,): health, ammo, armor, kills (frags in
deathmatch) and weapon, scaled and clipped to [-10, 10]. Action: MultiDiscrete over
the scenario's buttons (actions.py), each repeated for FRAMESKIP tics.

An episode end is truncated if the player is alive at the timeout (the trainer
bootstraps), else terminated. Deathmatch players respawn, so those episodes end only
by timeout; such a game is a network game fastrl hosts, alone or as a seat of a
DoomMatch (match.py). A dead or hung engine ends the step as truncated with
info["env_restarts"], and the next reset() starts a new one.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

import cv2
import gymnasium as gym
import numpy as np
import vizdoom as vzd
from fastrl.envs.doom import engine
from fastrl.envs.doom.actions import ActionMapper
from fastrl.envs.doom.scenarios import (
    BATTLE_SHAPING,
    ENGINE_RECYCLE_EPISODES,
    GATHERING_PICKUP_REWARD,
    DoomScenario,
    get_scenario,
)

FRAMESKIP = 4
OBS_HEIGHT, OBS_WIDTH = 72, 128
MEASUREMENTS = ("health", "ammo", "armor", "kills", "weapon")
DEFAULT_HANG_TIMEOUT_S = 20.0
INIT_ATTEMPTS = 3

# Game variables every game gets (appended to the scenario's own): the
# measurements, the battle reward and the objectives read them.
TRACKED_VARIABLES = (
    "KILLCOUNT", "FRAGCOUNT", "HEALTH", "ARMOR", "SELECTED_WEAPON", "SELECTED_WEAPON_AMMO",
    "DAMAGECOUNT", "DEAD", "AMMO2", "AMMO3", "AMMO4", "AMMO5",
    "WEAPON1", "WEAPON2", "WEAPON3", "WEAPON4", "WEAPON5", "WEAPON6", "WEAPON7",
)

VIZDOOM_FAILURES = (
    vzd.ViZDoomErrorException, vzd.ViZDoomIsNotRunningException, vzd.ViZDoomUnexpectedExitException,
    vzd.MessageQueueException, vzd.SharedMemoryException,
)
# A seat of a match also fails when another seat's engine does: the tic barrier
# they share breaks (match.py), or times out waiting for it.
SEAT_FAILURES = VIZDOOM_FAILURES + (threading.BrokenBarrierError,)

_cv2_threads_set = False
# File descriptor 2 is the process's, not a thread's: two games configured at once
# would take each other's stderr.
_FD2_LOCK = threading.Lock()


def _with_fd2_taken(fn, *args):
    """(fn(*args), what it wrote to file descriptor 2 meanwhile). ViZDoom's config
    parser complains there from C++ and only returns False; taking the complaints lets
    the error say why. Other threads' stderr in the moment is taken too."""
    sys.stderr.flush()
    with _FD2_LOCK, tempfile.TemporaryFile() as taken:
        saved = os.dup(2)
        os.dup2(taken.fileno(), 2)
        try:
            result = fn(*args)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        taken.seek(0)
        return result, taken.read().decode(errors="replace")


def _first_complaint(complaints: str) -> str:
    """'Syntax error in line #1' from ViZDoom's 'WARNING! Loading config from:
    "PATH". Syntax error in line #1. Line ignored.', with a count of the rest."""
    lines = [line for line in complaints.splitlines() if line.strip()]
    if not lines:
        return "it gave no reason"
    first = lines[0].split('". ', 1)[-1].removesuffix(" Line ignored.").removesuffix(" Lines ignored.").rstrip(".")
    return first + (f", and {len(lines) - 1} more complaint(s)" if len(lines) > 1 else "")


def _absolute_wad_in(config_path: str) -> str | None:
    """The config's doom_scenario_path if it is absolute. ViZDoom 1.3.2 joins it to
    the config's folder even then (/cfg/dir + /abs/map.wad), so fastrl sets it."""
    try:
        with open(config_path, errors="replace") as f:
            for line in f:
                key, sep, value = line.split("#", 1)[0].partition("=")
                if sep and key.strip().lower().replace("-", "_") == "doom_scenario_path":
                    value = value.strip()
                    return value if os.path.isabs(value) else None
    except OSError:
        pass
    return None


class DoomEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 35 // FRAMESKIP}

    def __init__(self, scenario: str | DoomScenario = "doom_basic", seed: int | None = None, *,
                 config_path: str | None = None, measurements: bool = False, hud: bool = False,
                 render_mode: str | None = None,
                 episode_timeout: int | None = None, num_bots: int | None = None,
                 hang_timeout: float = DEFAULT_HANG_TIMEOUT_S,
                 engine_recycle_episodes: int = ENGINE_RECYCLE_EPISODES, seat=None):
        """scenario: a name from scenarios.SCENARIOS (or a DoomScenario).
        config_path: a ViZDoom .cfg used instead of the scenario's (required for
            doom_custom); the scenario still picks reward and objective.
        hud: render Doom's status bar (health, ammo, armour, weapons) into the frame,
            so the policy can read them, as Sample Factory's Doom configs do.
        episode_timeout: override of the config's episode_timeout, in engine tics.
        num_bots: override of the scenario's bot count (bot scenarios only).
        hang_timeout: seconds one engine call may take before the engine counts as hung.
        engine_recycle_episodes: start a fresh engine after this many episodes (0: never),
            as an engine's memory creeps up over a long run; episodes stay the same.
        seat: this player's place in a DoomMatch, a match.Seat (deathmatch scenarios
            only): the match starts, steps, restarts and recycles its seats together."""
        global _cv2_threads_set
        if not _cv2_threads_set:
            # Resizing a small frame gains nothing from threads; cv2's pool would oversubscribe.
            cv2.setNumThreads(1)
            _cv2_threads_set = True
        self.scenario = scenario if isinstance(scenario, DoomScenario) else get_scenario(scenario)
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode {render_mode!r} is not supported by Doom envs; use 'rgb_array' or None")
        if config_path is None and not self.scenario.config:
            raise ValueError(f"{self.scenario.name} needs doom_scenario=PATH to a ViZDoom .cfg file")
        if config_path is not None and not os.path.isfile(config_path):
            raise ValueError(f"doom_scenario {config_path} is not a file; give the path to a ViZDoom .cfg")
        self.config_path = os.path.abspath(config_path) if config_path else self.scenario.config_path()
        self._custom_config = config_path is not None
        self.render_mode = render_mode
        self.measurements = bool(measurements)
        self.hud = bool(hud)
        self.episode_timeout = episode_timeout
        self.num_bots = self.scenario.bots if num_bots is None else int(num_bots)
        self.hang_timeout = float(hang_timeout)
        if int(engine_recycle_episodes) < 0:
            raise ValueError(f"engine_recycle_episodes must be 0 (never) or a positive count, "
                             f"not {engine_recycle_episodes}")
        self.engine_recycle_episodes = int(engine_recycle_episodes)
        if seat is not None and not self.scenario.deathmatch:
            raise ValueError(f"{self.scenario.name} is not a deathmatch scenario; only those seat several players")
        self.seat = seat
        # A seat's engine starts once per try, with its match's others (a host that
        # retried alone would wait for players who are not coming).
        self._init_attempts = 1 if seat is not None else INIT_ATTEMPTS
        self.engine_recycles = 0  # engines replaced by a fresh one after engine_recycle_episodes
        self._episodes_on_engine = 0
        self.frameskip = FRAMESKIP
        self._init_seed = seed
        self._seeded = False
        self._game: vzd.DoomGame | None = None
        self._handle: engine.EngineHandle | None = None
        self._closed = False
        self._needs_reset = True
        self.restarts = 0  # engines restarted after a crash or hang
        self._restarts_reported = 0  # of those, the ones an info dict has carried out
        self.mutex_repairs = 0  # queue mutexes released after their engine died holding them

        self._start_game()  # here, not at reset: a bad config fails at construction
        game = self._game
        self._actions = ActionMapper([b.name for b in game.get_available_buttons()], FRAMESKIP)
        self.action_space = gym.spaces.MultiDiscrete(self._actions.nvec, seed=seed)
        image = gym.spaces.Box(0, 255, (3, OBS_HEIGHT, OBS_WIDTH), np.uint8, seed=seed)
        if self.measurements:
            meas = gym.spaces.Box(-10.0, 10.0, (len(MEASUREMENTS),), np.float32, seed=seed)
            self.observation_space = gym.spaces.Dict({"obs": image, "measurements": meas}, seed=seed)
        else:
            self.observation_space = image
        self._setup_variables([v.name for v in game.get_available_game_variables()])
        self._last_obs = self._blank_obs()
        self._last_frame = np.zeros((120, 160, 3), np.uint8)

    # -- the game ------------------------------------------------------------------
    def _configure(self) -> vzd.DoomGame:
        game = vzd.DoomGame()
        loaded, complaints = _with_fd2_taken(game.load_config, self.config_path)
        if not loaded:
            raise ValueError(f"ViZDoom could not load the config {self.config_path}: {_first_complaint(complaints)}")
        sys.stderr.write(complaints)  # warnings about a config it did load are the user's to see
        wad = _absolute_wad_in(self.config_path) if self._custom_config else self.scenario.wad_path()
        if wad is not None:
            game.set_doom_scenario_path(wad)
        game.set_window_visible(False)
        game.set_sound_enabled(False)
        game.set_audio_buffer_enabled(False)
        game.set_console_enabled(False)
        game.set_mode(vzd.Mode.PLAYER)
        game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
        game.set_screen_format(vzd.ScreenFormat.RGB24)
        game.set_render_hud(self.hud)
        for off in (game.set_render_minimal_hud, game.set_render_crosshair, game.set_render_decals,
                    game.set_render_particles, game.set_render_effects_sprites,
                    game.set_render_messages, game.set_depth_buffer_enabled, game.set_labels_buffer_enabled,
                    game.set_automap_buffer_enabled, game.set_objects_info_enabled, game.set_sectors_info_enabled):
            off(False)
        if self.episode_timeout is not None:
            game.set_episode_timeout(int(self.episode_timeout))
        if self.scenario.deathmatch:
            game.add_game_args(self._network_args())
        have = {v.name for v in game.get_available_game_variables()}
        for name in TRACKED_VARIABLES:
            if name not in have:
                game.add_available_game_variable(getattr(vzd.GameVariable, name))
        return game

    def _network_args(self) -> str:
        """Host a game alone, or take this seat of a match: its first seat hosts the
        game for all (init returns once every player has joined), the others join
        it on 127.0.0.1 at the match's port."""
        seat = self.seat
        if seat is None:
            return "-host 1"
        wait = f"+viz_connect_timeout {seat.connect_timeout:g} +name agent{seat.index} +colorset {seat.index}"
        if seat.index == 0:
            return f"-host {seat.players} -port {seat.port} -netmode 0 {wait}"
        return f"-join 127.0.0.1 -port {seat.port} {wait}"

    def _start_game(self) -> None:
        last = None
        for _ in range(self._init_attempts):
            game = self._configure()
            try:
                self._handle = engine.init_game(game, self.hang_timeout)
                self._game = game
                self._episodes_on_engine = 0
                engine.track_open(self)
                return
            except VIZDOOM_FAILURES as err:
                # An engine that died while starting is replaced and counted like one
                # that died later.
                last = err
                engine.end_game(game, None)
                self.restarts += 1
        raise RuntimeError(f"ViZDoom failed to start {self.scenario.name} {self._init_attempts} times; "
                           f"last error: {last}")

    def _end_game(self) -> None:
        game, handle = self._game, self._handle
        self._game = self._handle = None
        if game is not None:
            engine.end_game(game, handle)
        if handle is not None:
            self.mutex_repairs += handle.mutex_repairs

    def _call(self, fn, *args):
        """A call into the game, visible to the watchdog while it runs."""
        h = self._handle
        h.call_started = time.monotonic()
        try:
            return fn(*args)
        finally:
            h.call_started = 0.0

    # -- variables, reward, observation --------------------------------------------
    def _setup_variables(self, available: list) -> None:
        self._var_names = tuple(available)
        idx = {n: i for i, n in enumerate(available)}
        self._i = {n: idx[n] for n in TRACKED_VARIABLES}
        kills = "FRAGCOUNT" if self.scenario.objective == "frags" else "KILLCOUNT"
        self._meas_idx = np.array([idx["HEALTH"], idx["SELECTED_WEAPON_AMMO"], idx["ARMOR"], idx[kills],
                                   idx["SELECTED_WEAPON"]])
        self._meas_scale = np.array([1 / 100, 1 / 100, 1 / 100, 1 / 10, 1 / 7])
        # (variable index, whether only a rise counts, weight) as plain Python: the
        # variables are a list each step, and numpy over them would cost more.
        self._shaping = tuple((idx[n], sign == "+", float(w)) for n, sign, w in BATTLE_SHAPING)

    def _read_variables(self) -> list:
        game = self._game
        return [game.get_game_variable(getattr(vzd.GameVariable, n)) for n in self._var_names]

    def _reward(self, game_reward: float, now: list, before: list) -> float:
        """The scenario's reward for one step, from the game's and the game
        variables `now` and `before` it (lists of floats, in _var_names' order)."""
        kind = self.scenario.reward
        if kind == "game":
            return float(game_reward)
        if kind == "frags":
            i = self._i["FRAGCOUNT"]
            return float(now[i] - before[i])
        if kind == "gathering":
            i = self._i["HEALTH"]
            return float(game_reward) + (GATHERING_PICKUP_REWARD if now[i] > before[i] else 0.0)
        reward = 0.0
        for i, rise_only, weight in self._shaping:
            change = now[i] - before[i]
            if change > 0.0 or not rise_only:
                reward += change * weight
        return reward

    def _objective(self, variables: list) -> float:
        kind = self.scenario.objective
        if kind == "kills":
            return float(variables[self._i["KILLCOUNT"]])
        if kind == "frags":
            return float(variables[self._i["FRAGCOUNT"]])
        return float(self._episode_game_reward)

    def _blank_obs(self):
        image = np.zeros((3, OBS_HEIGHT, OBS_WIDTH), np.uint8)
        if self.measurements:
            return {"obs": image, "measurements": np.zeros(len(MEASUREMENTS), np.float32)}
        return image

    def _observe(self, state) -> object:
        frame = state.screen_buffer  # (120, 160, 3) uint8
        self._last_frame = frame
        # Bilinear: much cheaper than INTER_AREA and fine for this mild downscale.
        small = cv2.resize(frame, (OBS_WIDTH, OBS_HEIGHT), interpolation=cv2.INTER_LINEAR)
        # A [C, H, W] view of the [H, W, C] frame, not a copy: the trainer's buffers
        # store images channels-last, so the frame reaches them in one plain copy.
        image = small.transpose(2, 0, 1)
        if not self.measurements:
            return image
        meas = np.clip(state.game_variables[self._meas_idx] * self._meas_scale, -10.0, 10.0).astype(np.float32)
        return {"obs": image, "measurements": meas}

    # -- gymnasium API -------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._closed:
            raise RuntimeError("reset() on a closed DoomEnv")
        if seed is None and not self._seeded:
            seed = self._init_seed
        super().reset(seed=seed)
        if seed is not None:
            self._seeded = True
        last = None
        if self._game is not None and 0 < self.engine_recycle_episodes <= self._episodes_on_engine:
            self._end_game()  # started again below, like an engine that crashed between episodes
            self.engine_recycles += 1
        for _ in range(self._init_attempts):
            try:
                if self._game is None:
                    self._start_game()
                game = self._game
                game.set_seed(int(self.np_random.integers(0, 2**31 - 1)))
                self._call(game.new_episode)
                if self.num_bots > 0 and (self.seat is None or self.seat.index == 0):  # the host's to add
                    game.send_game_command("removebots")
                    for _ in range(self.num_bots):
                        game.send_game_command("addbot")
                state = game.get_state()
                if state is None:
                    raise vzd.ViZDoomErrorException("the new episode ended before its first frame")
                break
            except VIZDOOM_FAILURES as err:
                last = err
                self._end_game()
                self.restarts += 1
        else:
            raise RuntimeError(f"ViZDoom failed to start an episode of {self.scenario.name} "
                               f"{self._init_attempts} times; last error: {last}")
        self._episodes_on_engine += 1
        self._vars = state.game_variables.tolist()
        self._episode_game_reward = 0.0
        self._needs_reset = False
        self._last_obs = self._observe(state)
        # A game that crashed between episodes, or while this env was made, was restarted.
        return self._last_obs, self._restarts_to_report()

    def _restarts_to_report(self) -> dict:
        """{"env_restarts": n} for the engine restarts no info has carried yet, or {}."""
        n = self.restarts - self._restarts_reported
        self._restarts_reported = self.restarts
        return {"env_restarts": n} if n else {}

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("step() before reset() or after the episode ended; call reset()")
        buttons = self._actions(action)
        game = self._game
        try:
            if self.seat is None:
                game_reward = self._call(game.make_action, buttons, FRAMESKIP)
            else:
                game_reward = self._seated_tics(game, buttons)
            finished = game.is_episode_finished()
            # A seat is respawned by the game's rules (sv_forcerespawn): respawn_player
            # advances this player's game alone, which a network game waits on forever.
            if not finished and self.seat is None and self.scenario.deathmatch and game.is_player_dead():
                game.respawn_player()
                finished = game.is_episode_finished()
            state = None if finished else game.get_state()
            if state is None:
                finished = True
                variables = self._read_variables()
                dead = game.is_player_dead()
                truncated = not dead and game.is_episode_timeout_reached()
            else:
                variables = state.game_variables.tolist()
        except SEAT_FAILURES:
            return self._crashed()
        self._episode_game_reward += game_reward
        reward = self._reward(game_reward, variables, self._vars)
        self._vars = variables
        info = {}
        if finished:
            self._needs_reset = True
            info["true_objective"] = self._objective(variables)
            return self._last_obs, reward, not truncated, truncated, info
        self._last_obs = self._observe(state)
        return self._last_obs, reward, False, False, info

    def _seated_tics(self, game, buttons) -> float:
        """FRAMESKIP tics of a network game, each waited for by every seat: with a whole
        make_action(a, 4) each, one engine could run a tic ahead and wait on the others'
        next step, which waits on it, and both hang."""
        reward = 0.0
        for k in range(FRAMESKIP):
            game.set_action(buttons)
            self._call(game.advance_action, 1, k == FRAMESKIP - 1)
            reward += game.get_last_reward()
            self.seat.tic_barrier.wait(self.hang_timeout)
        return reward

    def _crashed(self):
        """The engine died or hung mid-episode: end the episode as truncated (it did
        not end in the game), report the objective so far, restart at reset()."""
        self._end_game()
        self.restarts += 1
        info = {**self._restarts_to_report(), "true_objective": self._objective(self._vars)}
        self._needs_reset = True
        return self._last_obs, 0.0, False, True, info

    def end_engine(self) -> None:
        """End this env's engine now, mid-episode or not; the next reset() starts a new
        one (a match ends every seat's together: match.py)."""
        self._end_game()
        self._needs_reset = True

    def objective_so_far(self) -> float:
        """The true objective of the episode up to the last step."""
        return self._objective(self._vars)

    def render(self):
        if self.render_mode == "rgb_array":
            return np.array(self._last_frame, copy=True)
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._needs_reset = True
        self._end_game()
        engine.forget_open(self)

    # -- introspection (tests, tools) ----------------------------------------------
    @property
    def engine_pid(self) -> int | None:
        return self._handle.engine_pid if self._handle is not None else None

    @property
    def instance_id(self) -> str | None:
        return self._handle.instance_id if self._handle is not None else None

    @property
    def game(self) -> vzd.DoomGame | None:
        return self._game

    def action_meanings(self) -> str:
        return self._actions.describe()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
