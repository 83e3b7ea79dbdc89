"""Several learning agents in one ViZDoom game (envs/doom/match.py): real engines,
a real network game on 127.0.0.1, and the trainer's run of doom_duel with two
policies whose agents play each other."""
import os
import signal

import numpy as np
import pytest
from helpers import TrainRun, read_summary

pytest.importorskip("vizdoom")
pytest.importorskip("cv2")
import vizdoom  # noqa: E402
from fastrl.envs.doom import engine, net_yield  # noqa: E402
from fastrl.envs.doom.match import DoomMatch  # noqa: E402
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.config import Config, splits_per_worker  # noqa: E402


def noop(env):
    return np.zeros(len(env.action_space.nvec), dtype=np.int64)


def step_all(agents, actions):
    for env, action in zip(agents, actions):
        env.step_send(action)
    return [env.step_receive() for env in agents]


def engines_and_segments(match):
    return [p.engine_pid for p in match.players], [p.instance_id for p in match.players]


def test_two_agents_share_a_game_end_together_and_each_scores_its_own_frags():
    match = DoomMatch("doom_duel", seed=3, episode_timeout=120)
    agents = match.agents
    try:
        assert len(agents) == 2 and agents[0].observation_space.shape == (3, 72, 128)
        assert [p.seat.index for p in match.players] == [0, 1]
        first = [env.reset(seed=11) for env in agents]
        assert all(obs.shape == (3, 72, 128) for obs, _ in first)
        # Agent 1 (the player who joined) kills itself: its death and frag are its own.
        match.players[1].game.send_game_command("kill")
        totals, steps, objectives = [0.0, 0.0], 0, None
        while objectives is None:
            results = step_all(agents, [noop(env) for env in agents])
            steps += 1
            for i, (_, reward, _, _, _) in enumerate(results):
                totals[i] += reward
            ended = [term or trunc for _, _, term, trunc, _ in results]
            assert all(ended) or not any(ended)  # one game, one timeout: the same step for both
            if all(ended):
                assert all(trunc and not term for _, _, term, trunc, _ in results)  # a timeout, not a death
                objectives = [info["true_objective"] for *_, info in results]
        assert steps == 30  # 120 tics of 4
        deaths = [p.game.get_game_variable(vizdoom.GameVariable.DEATHCOUNT) for p in match.players]
        frags = [p.game.get_game_variable(vizdoom.GameVariable.FRAGCOUNT) for p in match.players]
        # (The host's DEATHCOUNT reads 1 from the start of every episode in ViZDoom
        # 1.3.2, as a quirk of hosting; the joined player's counts from 0.)
        assert deaths[1] == 1.0
        # ZDoom usually charges a suicide a frag, not always (tests/test_doom.py): each
        # agent's reward and objective are its own player's count, whichever it is.
        assert totals == frags == objectives and frags[0] == 0.0 and frags[1] in (0.0, -1.0)
        # Both start the next episode together.
        again = [env.reset(seed=12) for env in agents]
        assert all(obs.shape == (3, 72, 128) for obs, _ in again)
        results = step_all(agents, [noop(env) for env in agents])
        assert not any(term or trunc for _, _, term, trunc, _ in results)
    finally:
        pids, ids = engines_and_segments(match)
        match.close()
    assert not any(engine.pid_alive(pid) for pid in pids if pid)
    assert not any(engine.game_segments(i) for i in ids if i)


def test_two_learning_agents_join_a_deathmatch_with_bots():
    match = DoomMatch("doom_deathmatch", seed=4, agents=2, episode_timeout=60, num_bots=2)
    agents = match.agents
    try:
        for env in agents:
            env.reset(seed=1)
        results = step_all(agents, [noop(env) for env in agents])
        assert not any(term or trunc for _, _, term, trunc, _ in results)
        # Both agents are players of one game, with the host's bots: four in all.
        assert [p.game.get_game_variable(vizdoom.GameVariable.PLAYER_COUNT) for p in match.players] == [4.0, 4.0]
        assert not np.array_equal(results[0][0], results[1][0])  # each sees from its own player
    finally:
        match.close()


def test_a_dead_engine_ends_every_agents_episode_and_the_next_reset_restarts_the_game():
    match = DoomMatch("doom_duel", seed=5, episode_timeout=400)
    agents = match.agents
    try:
        for env in agents:
            env.reset(seed=1)
        old_port = match.port
        os.kill(match.players[0].engine_pid, signal.SIGKILL)  # the host
        results = step_all(agents, [noop(env) for env in agents])
        for _, reward, term, trunc, info in results:  # at once, not after the hang timeout
            assert trunc and not term and reward == 0.0 and "true_objective" in info
        assert results[0][4].get("env_restarts") == 1
        assert all(p.game is None for p in match.players)
        for env in agents:
            env.reset(seed=2)
        assert match.port != old_port and all(p.game is not None for p in match.players)
        results = step_all(agents, [noop(env) for env in agents])
        assert not any(term or trunc for _, _, term, trunc, _ in results)
    finally:
        match.close()


def test_an_agent_that_receives_before_every_agent_sent_is_told_how_to_step():
    match = DoomMatch("doom_duel", seed=7, episode_timeout=400)
    try:
        for env in match.agents:
            env.reset(seed=1)
        with pytest.raises(RuntimeError, match="call step_send on every agent, then step_receive"):
            match.agents[0].step(noop(match.agents[0]))
        match.agents[1].step_send(noop(match.agents[1]))  # the game then moves for both
        assert len(match.agents[0].step_receive()) == 5 and len(match.agents[1].step_receive()) == 5
    finally:
        match.close()


def test_only_deathmatch_scenarios_hold_several_agents():
    assert get_spec("doom_duel").make_match is not None and get_spec("doom_deathmatch").make_match is not None
    assert get_spec("doom_basic").make_match is None
    with pytest.raises(ValueError, match="not a deathmatch scenario"):
        DoomMatch("doom_basic", seed=0)


@pytest.mark.parametrize("inference, policies, agents, splits", [
    ("local", 1, 1, 1), ("policy_worker", 1, 1, 2), ("local", 3, 1, 3),
    ("local", 1, 2, 2), ("local", 2, 2, 2), ("policy_worker", 2, 2, 4), ("local", 3, 2, 4), ("local", 4, 2, 4),
])
def test_each_agent_of_a_game_has_its_own_split_in_every_step_group(inference, policies, agents, splits):
    assert splits_per_worker(inference, policies, agents) == splits
    cfg = Config(env="doom_duel", inference=inference, num_policies=policies, num_envs_per_worker=4 * splits)
    assert cfg.agents_per_game == 2 and Config(env="doom_duel", doom_agents=3).agents_per_game == 3
    assert Config(env="doom_basic").agents_per_game == 1


def test_two_policies_play_each_other_in_doom_duel_and_each_learner_gets_its_agents_samples(tmp_path):
    # One worker, 4 games: policy 0's agents host them, policy 1's join. 20,000 frames are
    # 625 steps of each agent, past the end of its first 525-step episode.
    args = ["--env", "doom_duel", "--num_policies", "2", "--plan", "off", "--num_workers", "1",
            "--num_envs_per_worker", "8", "--rollout", "16", "--batch_size", "64", "--use_rnn", "false",
            "--rnn_size", "64", "--status_every_seconds", "2", "--train_dir", str(tmp_path),
            "--train_for_env_frames", "20000"]
    run = TrainRun(args)
    assert run.wait(timeout=240) == 0, run.output()
    assert "by policy" in run.output()
    summary = read_summary(tmp_path, "doom_duel")
    for k, policy in enumerate(summary["policies"]):
        # Each learner trained on its own agents' trajectories, and their episodes
        # (a frag count each, from that agent's own player) were counted for it.
        assert policy["policy"] == k and policy["samples_trained"] >= 64 and policy["learner_steps"] >= 1
        assert policy["mean_objective_100"] is not None  # its agents finished episodes
    assert summary["samples_trained"] == sum(p["samples_trained"] for p in summary["policies"])
    assert run.leftover_processes() == [] and run.new_shm_entries() == set()


def engine_environment(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        pairs = [item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the engines' environment from /proc")
@pytest.mark.skipif(net_yield._compiler() is None, reason="no C compiler on this machine to build the shim with")
def test_only_the_engines_of_a_match_get_the_network_shim():
    assert net_yield.library_path() is not None
    match = DoomMatch("doom_duel", seed=9, episode_timeout=400)
    alone = get_spec("doom_deathmatch").make(seed=9, doom_num_bots=0)
    try:
        for pid in (p.engine_pid for p in match.players):
            assert net_yield.library_path() in engine_environment(pid).get("LD_PRELOAD", "")
        assert "doom-net-yield" not in engine_environment(alone.engine_pid).get("LD_PRELOAD", "")
    finally:
        match.close()
        alone.close()


def test_without_a_compiler_a_match_plays_on_without_the_shim(monkeypatch):
    monkeypatch.setattr(net_yield, "_compiler", lambda: None)
    monkeypatch.setattr(net_yield, "_tried", False)
    monkeypatch.setattr(net_yield, "_built", None)
    monkeypatch.delenv(net_yield.ENV_VAR, raising=False)
    match = DoomMatch("doom_duel", seed=10, episode_timeout=400)
    try:
        assert net_yield.library_path() is None
        assert all("doom-net-yield" not in engine_environment(p.engine_pid).get("LD_PRELOAD", "")
                   for p in match.players)
        for env in match.agents:
            env.reset(seed=1)
        results = step_all(match.agents, [noop(env) for env in match.agents])
        assert not any(term or trunc for _, _, term, trunc, _ in results)
    finally:
        match.close()
