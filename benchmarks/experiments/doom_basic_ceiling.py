"""The most a policy can score on doom_basic, spawn by spawn, and what that allows a
100-episode mean.

    python benchmarks/experiments/doom_basic_ceiling.py [--episodes 1000] [--seed 5000]
                                                        [--policy_log enjoy.txt] [--check_episodes 20]

doom_basic's monster spawns at a random place on the far wall; the agent strafes
left or right (MultiDiscrete([3, 2]): strafe none / left / right, attack no / yes,
each held for 4 tics) and scores 101 for the kill, -1 a tic, -5 a missed shot. Its
first pistol shot is exact, so a best play from a spawn is: strafe towards the
monster for k steps, perhaps coast for m steps, fire once. ViZDoom's game is
deterministic given its seed and the actions, so for each spawn this script replays
the episode from its seed for every k (up to two past the best found), m in 0..2,
and the shot with or without the strafe held, and keeps the best score: the
scenario's ceiling for that spawn under fastrl's action interface.

Episode i uses the game seed that `fastrl.enjoy --seed S` gives its episode i
(DoomEnv.reset(seed=S + i) draws it from the env's generator), so the ceiling and a
trained policy's `fastrl.enjoy ... --episodes N --seed S --deterministic` output
(--policy_log) are compared spawn by spawn. --check_episodes replays the best plays
of the first episodes through fastrl's own DoomEnv and stops with an error if any
scores otherwise: the raw game here is the env a policy plays.

It then answers the question a "100-episode mean at 80 or more on every report"
goal asks: reports a few seconds apart at thousands of frames/s hold hundreds of new
episodes each, so each report is close to an independent mean of 100 episodes; for
the ceiling's episode scores (and the policy's), the chance that one report falls
under the threshold (from 200,000 resampled means) and that all of --reports do not.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys

import numpy as np

FRAMESKIP = 4  # fastrl's Doom frameskip (envs/doom/doom_env.py FRAMESKIP)
STRAFE_LEFT, STRAFE_RIGHT, IDLE = [1, 0, 0], [0, 1, 0], [0, 0, 0]  # basic.cfg: MOVE_LEFT, MOVE_RIGHT, ATTACK
# Steps played after the last planned action: the kill ends the episode a step or two
# after the shot; a shot that missed leaves the episode running, and the play fails.
TAIL_STEPS = 6
COAST_STEPS = (0, 1, 2)
RESAMPLES = 200_000


def game_seed(episode_seed: int) -> int:
    """The ViZDoom seed DoomEnv.reset(seed=episode_seed) gives its game."""
    from gymnasium.utils import seeding

    rng, _ = seeding.np_random(episode_seed)
    return int(rng.integers(0, 2**31 - 1))


def make_game():
    import vizdoom as vzd

    game = vzd.DoomGame()
    game.load_config(os.path.join(vzd.scenarios_path, "basic.cfg"))
    game.set_window_visible(False)
    game.set_screen_resolution(vzd.ScreenResolution.RES_160X120)
    game.set_objects_info_enabled(True)  # where the monster is: which way to strafe
    game.init()
    return game


def play(game, seed: int, actions: list) -> tuple:
    """(the kill ended the episode, its score, agent steps) of these actions from the
    spawn of `seed`, idling after them."""
    game.set_seed(seed)
    game.new_episode()
    score, steps = 0.0, 0
    for action in actions + [IDLE] * TAIL_STEPS:
        if game.is_episode_finished():
            break
        score += game.make_action(action, FRAMESKIP)
        steps += 1
    return game.is_episode_finished(), score, steps


def monster_offset(game, seed: int) -> float:
    game.set_seed(seed)
    game.new_episode()
    where = {o.name: o for o in game.get_state().objects}
    return where["Cacodemon"].position_y - where["DoomPlayer"].position_y


def best_play(game, seed: int) -> dict:
    """The best score from this spawn: strafe k steps towards the monster (MOVE_LEFT
    is +y when facing the far wall), coast m, fire."""
    towards = STRAFE_LEFT if monster_offset(game, seed) > 0 else STRAFE_RIGHT
    best = None
    k = 0
    while best is None or k <= best["strafe"] + 2:
        for coast in COAST_STEPS:
            for shot in ([0, 0, 1], [towards[0], towards[1], 1]):
                actions = [towards] * k + [IDLE] * coast + [shot]
                killed, score, steps = play(game, seed, actions)
                if killed and score > 0 and (best is None or score > best["score"]):
                    best = dict(score=score, steps=steps, strafe=k, coast=coast, actions=actions)
        k += 1
        if k > 20 and best is None:
            raise RuntimeError(f"no play from game seed {seed} killed the monster within 20 strafe steps")
    return best


def to_env_action(action: list) -> np.ndarray:
    """A raw button list as DoomEnv's MultiDiscrete([3, 2]) action (strafe, attack)."""
    strafe = 1 if action[0] else 2 if action[1] else 0
    return np.array([strafe, action[2]])


def check_through_fastrl(plays: list, first_seed: int) -> None:
    """Replay the best plays of the first episodes through fastrl's DoomEnv."""
    from fastrl.envs.registry import get_spec

    env = get_spec("doom_basic").make(seed=first_seed)
    try:
        for i, best in enumerate(plays):
            env.reset(seed=first_seed + i)
            score = 0.0
            for action in best["actions"] + [IDLE] * TAIL_STEPS:
                _, reward, terminated, truncated, _ = env.step(to_env_action(action))
                score += float(reward)  # the return fastrl.enjoy reports
                if terminated or truncated:
                    break
            if abs(score - best["score"]) > 1e-6:
                raise SystemExit(f"doom_basic_ceiling: episode {i} scored {score} in fastrl's DoomEnv and "
                                 f"{best['score']} in the raw game: the two are not the same env")
    finally:
        env.close()


def chance_under(scores: list, threshold: float, window: int, rng: np.random.Generator) -> float:
    """The chance that a mean of `window` episodes drawn from `scores` is under threshold."""
    draws = rng.choice(np.asarray(scores), size=(RESAMPLES, window), replace=True)
    return float((draws.mean(axis=1) < threshold).mean())


def read_policy_log(path: str) -> list:
    """Episode returns, in order, from `fastrl.enjoy` output ("episode 3: return 91.00, ...")."""
    pattern = re.compile(r"^episode (\d+): return (-?[\d.]+)")
    found = {}
    with open(path) as f:
        for line in f:
            m = pattern.match(line.strip())
            if m:
                found[int(m.group(1))] = float(m.group(2))
    return [found[i] for i in sorted(found)]


def describe(name: str, scores: list, args, rng) -> None:
    p = chance_under(scores, args.threshold, args.window, rng)
    hold = (1 - p) ** args.reports
    print(f"{name}: mean {statistics.mean(scores):.2f} over {len(scores)} episodes, sd {statistics.stdev(scores):.2f} "
          f"(a {args.window}-episode mean's standard error {statistics.stdev(scores) / args.window ** 0.5:.2f}); "
          f"a report under {args.threshold:g} with chance {p:.4f}, all {args.reports} at or over it with chance "
          f"{hold:.3f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--episodes", type=int, default=1000, help="spawns to play")
    parser.add_argument("--seed", type=int, default=5000, help="episode i uses fastrl.enjoy's seed --seed + i")
    parser.add_argument("--policy_log", default=None,
                        help="a `fastrl.enjoy --env doom_basic ... --episodes N --seed S` output to compare, spawn "
                             "by spawn, with the ceiling (same --seed and at least as many episodes)")
    parser.add_argument("--check_episodes", type=int, default=20,
                        help="replay the first N best plays through fastrl's DoomEnv (0: skip)")
    parser.add_argument("--threshold", type=float, default=80.0, help="the goal's 100-episode mean")
    parser.add_argument("--window", type=int, default=100, help="episodes in a reported mean")
    parser.add_argument("--reports", type=int, default=300, help="reports the goal asks to hold (30 min of 5-s reports "
                                                                 "from minute 5)")
    args = parser.parse_args(argv)

    game = make_game()
    plays = []
    for i in range(args.episodes):
        plays.append(best_play(game, game_seed(args.seed + i)))
    game.close()
    if args.check_episodes:
        check_through_fastrl(plays[:args.check_episodes], args.seed)
        print(f"the first {min(args.check_episodes, len(plays))} best plays score the same in fastrl's DoomEnv")

    ceiling = [p["score"] for p in plays]
    rng = np.random.default_rng(0)
    hist = collections.Counter(p["steps"] for p in plays)
    print("steps of the best play: " + ", ".join(f"{s}: {hist[s]}" for s in sorted(hist)))
    describe("ceiling", ceiling, args, rng)
    if args.policy_log:
        policy = read_policy_log(args.policy_log)
        if len(policy) < len(ceiling):
            raise SystemExit(f"doom_basic_ceiling: {args.policy_log} holds {len(policy)} episodes; "
                             f"play at least {len(ceiling)} with --seed {args.seed}")
        policy = policy[:len(ceiling)]
        describe("policy", policy, args, rng)
        gap = [c - p for c, p in zip(ceiling, policy)]
        above = sum(g < 0 for g in gap)
        if above:
            print(f"warning: the policy beat the ceiling on {above} spawns: the search above misses some plays")
        print(f"policy against ceiling, spawn by spawn: {sum(g == 0 for g in gap)} of {len(gap)} equal, "
              f"mean gap {statistics.mean(gap):.2f} ({statistics.mean(gap) / FRAMESKIP:.2f} steps), "
              f"gaps: {dict(sorted(collections.Counter(round(g) for g in gap).items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
