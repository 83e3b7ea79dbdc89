"""Atari games through ale-py (which ships its ROMs), with the standard preprocessing:
atari_<game> for every ROM, the game in ALE's snake_case (atari_pong, ...).

One agent step: ALE v5 settings with ALE's frameskip off and no sticky actions unless
asked (a benchmark-protocol choice); the action repeated FRAMESKIP times; the pixel-max
of the last two grayscale frames (some sprites are drawn on alternate frames); 84x84
INTER_AREA (keeps thin objects like Pong's ball); 4 frames stacked, uint8 (4, 84, 84).
A new game starts with 1..30 random no-ops, then FIRE where the game waits for it.

Episodic life (default): a lost life ends the learner's episode (terminated) while the
game goes on at the next reset(); the full game's score is info["true_objective"] when
the game really ends. ALE's 108,000-frame limit is reported as truncated. Rewards are
the game's own, unclipped: clipping is the trainer's choice.

Options: atari_sticky_actions=True (repeat probability 0.25), atari_episodic_life=False
(full games, for evaluation and watching), render_mode="rgb_array". Unknown atari_*
options are refused.
"""
from __future__ import annotations

import difflib
import functools

import gymnasium
import numpy as np

FRAMESKIP = 4
FRAME_SIZE = 84
STACK = 4
NOOP_MAX = 30
STICKY_PROBABILITY = 0.25
MAX_GAME_FRAMES = 108_000  # ALE v5's limit: 30 minutes of play at 60 Hz
RENDER_FPS = 60 // FRAMESKIP  # one rendered frame per agent step plays in real time

PREFIX = "atari_"
FEATURED = ("pong", "breakout", "space_invaders", "seaquest", "qbert", "beam_rider")
OPTIONS = ("atari_sticky_actions", "atari_episodic_life")
INSTALL_HINT = "install them with: pip install 'fastrl[atari]' (ale-py ships the ROMs)"


@functools.lru_cache(maxsize=1)
def atari_env_names() -> tuple:
    """atari_<game> for every ROM ale-py ships; only the featured games without ale-py,
    so that did-you-mean and the env list still work where it is not installed."""
    try:
        from ale_py.roms import get_all_rom_ids
    except ImportError:
        games = FEATURED
    else:
        games = tuple(get_all_rom_ids())
    return tuple(PREFIX + game for game in games)


def game_of(name: str) -> str:
    return name[len(PREFIX):]


def describe(name: str) -> str:
    return (f"Atari {game_of(name)} (ALE v5, frameskip {FRAMESKIP} with max-pooling, {FRAME_SIZE}x{FRAME_SIZE} "
            f"gray x{STACK}, noop starts, episodic life by default)")


def make_atari_env(name: str, seed: int | None = None, **options) -> "AtariEnv":
    """The preprocessed env for fastrl name atari_<game>; see the module docstring for options."""
    for key in options:
        if key.startswith(PREFIX) and key not in OPTIONS:
            close = difflib.get_close_matches(key, OPTIONS, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(OPTIONS)}"
            raise ValueError(f"unknown Atari option {key}{hint}")
    return AtariEnv(game_of(name), seed=seed,
                    sticky_actions=bool(options.get("atari_sticky_actions", False)),
                    episodic_life=bool(options.get("atari_episodic_life", True)),
                    render_mode=options.get("render_mode"))


class AtariEnv(gymnasium.Env):
    """One ALE game behind the module docstring's preprocessing, driving the ALE
    interface directly so only the two pooled frames are read from the emulator.
    `max_game_frames` lets tests reach the time limit quickly."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": RENDER_FPS}

    def __init__(self, game: str, seed: int | None = None, sticky_actions: bool = False,
                 episodic_life: bool = True, render_mode: str | None = None,
                 max_game_frames: int = MAX_GAME_FRAMES):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r} is not supported by Atari envs; use 'rgb_array'.")
        try:
            import ale_py
            import cv2
            from ale_py.env import AtariEnv as AleEnv
        except ImportError as err:
            raise ImportError(f"Atari games need ale-py and OpenCV, which are not installed ({err}); "
                              f"{INSTALL_HINT}") from err
        self._cv2 = cv2
        # ALE prints a banner per emulator (dozens per run); errors still get through.
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        self._game = AleEnv(game=game, obs_type="grayscale", frameskip=1,
                            repeat_action_probability=STICKY_PROBABILITY if sticky_actions else 0.0,
                            full_action_space=False, max_num_frames_per_episode=max_game_frames,
                            render_mode=render_mode)
        self._ale = self._game.ale
        self._actions = self._ale.getMinimalActionSet()
        meanings = self._game.get_action_meanings()
        self._fire = len(meanings) > 1 and meanings[1] == "FIRE"
        self.episodic_life = episodic_life
        self.render_mode = render_mode
        self.observation_space = gymnasium.spaces.Box(0, 255, (STACK, FRAME_SIZE, FRAME_SIZE), np.uint8)
        self.action_space = gymnasium.spaces.Discrete(len(self._actions))
        height, width = self._ale.getScreenDims()
        self._raw = np.zeros((2, height, width), np.uint8)  # the last two frames of a step, to pool
        self._stack = np.zeros(self.observation_space.shape, np.uint8)
        self._first_seed = seed  # used by the first reset() that gets no seed of its own
        if seed is not None:
            self.action_space.seed(seed)
        self._continue_game = False  # the last episode ended by a life loss with the game still on
        self._ale_seeded = False  # ALE's own random stream seeded (by the first seed a game got)
        self._lives = 0
        self._game_return = 0.0

    # -- gymnasium API --------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed, self._first_seed = self._first_seed, None
        super().reset(seed=seed)
        # After a lost life the game goes on, seed or no seed: the trainer seeds every
        # reset, and a new game each time would never reach game over (no true
        # objective) and reload the ROM every life.
        if self._continue_game:
            frame = self._next_life()
        else:
            frame = self._new_game(seed)
        self._continue_game = False
        self._stack[:] = frame
        return self._stack.copy(), {"lives": self._lives}

    def step(self, action):
        reward, frame = self._repeat(self._actions[int(action)])
        game_over = self._ale.game_over(with_truncation=False)
        out_of_time = self._ale.game_truncated()
        lives = self._ale.lives()
        life_lost = lives < self._lives
        self._lives = lives
        info = {"lives": lives}
        if game_over or out_of_time:
            info["true_objective"] = self._game_return
        elif life_lost:
            if self.episodic_life:
                self._continue_game = True
            elif self._fire:
                # A full-game episode presses the FIRE the game waits for, as reset()
                # does with episodic life, so both modes play alike.
                fire_reward, frame = self._repeat(self._actions[1])
                reward += fire_reward
        terminated = game_over or (life_lost and self.episodic_life)
        self._push(frame)
        return self._stack.copy(), reward, terminated, out_of_time and not terminated, info

    def render(self):
        if self.render_mode == "rgb_array":
            return self._ale.getScreenRGB()
        return None

    def close(self) -> None:
        self._game.close()

    # -- helpers --------------------------------------------------------------------------
    def _repeat(self, action) -> tuple:
        """Play `action` for FRAMESKIP frames (fewer if the game ends), adding to the game
        score: (reward, pooled 84x84 frame)."""
        reward, grabbed = 0.0, 0
        for i in range(FRAMESKIP):
            reward += self._ale.act(action)
            ended = self._ale.game_over()  # game over or time limit
            if i >= FRAMESKIP - 2 or ended:
                self._ale.getScreenGrayscale(self._raw[grabbed])
                grabbed += 1
            if ended:
                break
        self._game_return += reward
        pooled = np.maximum(self._raw[0], self._raw[1]) if grabbed == 2 else self._raw[0]
        return reward, self._resize(pooled)

    def _new_game(self, seed: int | None) -> np.ndarray:
        """Reset the game, then random no-ops and FIRE. ALE takes a seed only by
        reloading the ROM, which is slow, so only the first seed given seeds it and later
        games continue its random stream."""
        self._game.reset(seed=None if self._ale_seeded else seed)
        self._ale_seeded = self._ale_seeded or seed is not None
        self._game_return = 0.0
        for _ in range(int(self.np_random.integers(1, NOOP_MAX + 1))):
            self._game_return += self._ale.act(self._actions[0])
            if self._ale.game_over():  # no game ends in 30 frames of idling; this only guards
                self._game.reset()
        self._lives = self._ale.lives()
        return self._next_life()

    def _next_life(self) -> np.ndarray:
        """The first frame of a life: after FIRE where the game waits for it."""
        if not self._fire:
            self._ale.getScreenGrayscale(self._raw[0])
            return self._resize(self._raw[0])
        _, frame = self._repeat(self._actions[1])
        if self._ale.game_over():  # the press itself ended the game: nothing left to continue
            return self._new_game(None)
        return frame

    def _push(self, frame: np.ndarray) -> None:
        self._stack[:-1] = self._stack[1:]  # numpy copies overlapping slices correctly
        self._stack[-1] = frame

    def _resize(self, frame: np.ndarray) -> np.ndarray:
        return self._cv2.resize(frame, (FRAME_SIZE, FRAME_SIZE), interpolation=self._cv2.INTER_AREA)
