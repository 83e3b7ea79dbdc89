"""benchmarks/experiments/doom_basic_ceiling.py: the best play it finds from a spawn is one that
fastrl's DoomEnv scores the same, no shorter play kills, and its odds against an exact
binomial reference."""
import math
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks", "experiments"))

import doom_basic_ceiling as ceiling  # noqa: E402  (benchmarks/experiments/ is not a package)

pytest.importorskip("vizdoom")


@pytest.fixture(scope="module")
def game():
    game = ceiling.make_game()
    yield game
    game.close()


def test_best_plays_score_alike_in_fastrls_env_and_nothing_shorter_kills(game):
    seeds = [ceiling.game_seed(7000 + i) for i in range(4)]
    plays = [ceiling.best_play(game, seed) for seed in seeds]
    ceiling.check_through_fastrl(plays, 7000)  # raises SystemExit on any difference
    for seed, best in zip(seeds, plays):
        assert best["score"] == 103 - 4 * best["steps"], best  # +101 a kill, -1 a tic, 4 tics a step
        # Every play of fewer steps, whichever way it strafes, fails to kill.
        for k in range(best["strafe"] + best["coast"]):
            for strafe in (ceiling.STRAFE_LEFT, ceiling.STRAFE_RIGHT):
                killed, score, _ = ceiling.play(game, seed, [strafe] * k + [[0, 0, 1]])
                assert not killed or score <= best["score"], (seed, k, strafe, score, best)


def test_chance_under_matches_the_binomial():
    # Scores 0 and 2 equally likely: a mean of 100 is under 0.9 when at most 44 are 2.
    exact = sum(math.comb(100, x) for x in range(45)) / 2**100
    got = ceiling.chance_under([0.0, 2.0], 0.9, 100, np.random.default_rng(1))
    assert got == pytest.approx(exact, abs=0.004)


def test_policy_log_reads_enjoys_episode_lines(tmp_path):
    log = tmp_path / "enjoy.txt"
    log.write_text("fastrl: playing 3 episode(s) of doom_basic with x.pt\n"
                   "episode 1: return 95.00, length 2, true objective 95.00\n"
                   "episode 2: return -12.50, length 9\n"
                   "episodes: 100%|####| 3/3\n"
                   "episode 3: return 67.00, length 9, true objective 67.00\n"
                   "mean return over 3 episode(s): 49.83\n")
    assert ceiling.read_policy_log(str(log)) == [95.0, -12.5, 67.0]
