"""A rollout worker's hand-off of a full trajectory buffer, and what it stores per
action: the next trajectory must begin with this env's own last row, and every
action must carry the version and log-prob of the weights that chose it. And its
requests to the policy workers: each answered once, even across their restart.
And its count of env restarts, on the board before the replacement env starts."""
from types import SimpleNamespace

import numpy as np
import torch
from fastrl.envs.registry import get_spec
from helpers import ListQueue

from fastrl.algo.distributions import ActionSpec
from fastrl.algo.model import Precision, build_model, flat_state, flat_state_size, obs_layout
from fastrl.config import Config
from fastrl.plumbing.buffers import HeldBuffers, TrajectoryBuffers
from fastrl.plumbing.params import SharedParams, StopFlag
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.sampling.inference import LocalPolicy, RemotePolicy
from fastrl.sampling.rollout_worker import RolloutWorker

ROLLOUT, ENVS = 4, 2


def _worker(num_buffers=3, on_put=None, env_id="CartPole-v1", policies=1, envs=ENVS):
    """A rollout worker of `policies` policies (one env split each) over `envs` envs,
    on list queues, each policy's weights published at version 100 x (policy + 1)."""
    cfg = Config(env=env_id, num_workers=1, num_envs_per_worker=envs, rollout=ROLLOUT,
                 batch_size=ROLLOUT * envs // policies, num_minibatches=1, num_policies=policies)
    env = get_spec(env_id).make(seed=0)
    action_spec = ActionSpec.from_space(env.action_space)
    buffers = TrajectoryBuffers(num_buffers, ROLLOUT, cfg.envs_per_split, obs_layout(env.observation_space),
                                action_spec.action_dim, action_spec.dtype, rnn_size=0)
    params = []
    for k in range(policies):
        model = build_model(cfg, env.observation_space, env.action_space)
        params.append(SharedParams(flat_state_size(model)))
        params[k].publish(flat_state(model), 0 if policies == 1 else 100 * (k + 1))
    ctx = SimpleNamespace(
        obs_space=env.observation_space, action_space=env.action_space, action_spec=action_spec,
        buffers=buffers, params=params, board=StatsBoard(["rollout_0"]), stop=StopFlag(),
        free_queue=ListQueue(range(num_buffers)), traj_queues=[ListQueue(on_put=on_put) for _ in range(policies)],
        episode_queue=ListQueue(), held_buffers=HeldBuffers(1, cfg.num_splits),
        first_handed=torch.zeros(1, dtype=torch.int8),
        precision=Precision("fp32", "fp32", "no image encoder"),
    )
    env.close()
    return RolloutWorker(cfg, 0, ctx), ctx


def test_each_policys_trajectories_go_to_its_own_learner_acted_by_its_own_weights():
    handed = []

    def learner_takes(buf):  # whichever learner's queue it is on, it is gathered and freed
        queue_of = next(k for k, q in enumerate(ctx.traj_queues) if buf in q.items)
        handed.append((queue_of, set(ctx.buffers.policy_version[buf].flatten().tolist())))
        ctx.traj_queues[queue_of].items.remove(buf)
        ctx.free_queue.items.append(buf)
        if len(handed) >= 12:
            ctx.stop.set()

    worker, ctx = _worker(num_buffers=6, on_put=learner_takes, policies=3, envs=6)
    try:
        assert worker._start_splits()
        worker._run_local()
    finally:
        for split in worker.splits:
            split.close()
    # Split s acts for policy s % 3: each trajectory reached that policy's queue,
    # and every action in it was chosen by that policy's weights (version 100 x (k + 1)).
    assert sorted({queue_of for queue_of, _ in handed}) == [0, 1, 2]
    assert all(versions == {100 * (queue_of + 1)} for queue_of, versions in handed), handed
    worker._flush_episodes(force=True)
    assert all(len(ep) == 4 and ep[3] in (0, 1, 2) for batch in ctx.episode_queue.items for ep in batch)


def test_next_trajectory_starts_from_this_envs_last_row_even_if_the_buffer_is_reused_at_once():
    # What the hand-off must survive: the moment a full buffer is on the queue, the
    # learner gathers and frees it, and another split takes it and writes over it
    # before this worker has even been given its next buffer.
    def learner_frees_and_another_split_overwrites(buf):
        ctx.traj_queues[0].items.remove(buf)
        for k in ctx.buffers.obs:
            ctx.buffers.obs[k][buf].fill_(-7.0)
        ctx.buffers.episode_start[buf].fill_(True)
        ctx.free_queue.items.append(buf)

    worker, ctx = _worker(on_put=learner_frees_and_another_split_overwrites)
    try:
        assert worker._start_splits()
        b, old = ctx.buffers, worker.buf[0]
        for t in range(ROLLOUT):
            worker._step_group([0])  # random-free: actions stay 0, CartPole steps fine
            if t < ROLLOUT - 1:
                assert worker._advance(0, torch.zeros(ENVS, 0))
        last_obs = b.obs["obs"][old, ROLLOUT].clone()
        last_start = b.episode_start[old, ROLLOUT].clone()
        assert not torch.all(last_obs == -7.0)

        assert worker._advance(0, torch.zeros(ENVS, 0))
        new = worker.buf[0]
        assert new != old and worker.t[0] == 0
        assert torch.equal(b.obs["obs"][new, 0], last_obs)
        assert torch.equal(b.episode_start[new, 0], last_start)
    finally:
        for split in worker.splits:
            split.close()


def test_a_worker_says_it_handed_a_trajectory_over_at_its_first_hand_off():
    # The workers that wait to make their envs (test_start_order.py) start on this.
    flags_at_put = []
    worker, ctx = _worker(on_put=lambda buf: flags_at_put.append(int(ctx.first_handed[0])))
    try:
        assert worker._start_splits()
        for _ in range(2 * ROLLOUT):
            assert int(ctx.first_handed[0]) == (1 if flags_at_put else 0)
            worker._step_group([0])
            assert worker._advance(0, torch.zeros(ENVS, 0))
        assert flags_at_put == [0, 1]  # said right after the first trajectory went on the queue
        assert int(ctx.first_handed[0]) == 1
    finally:
        for split in worker.splits:
            split.close()


def test_each_action_carries_the_version_log_prob_and_value_of_the_weights_that_chose_it():
    worker, ctx = _worker()
    try:
        assert worker._start_splits()
        policy = LocalPolicy(worker.cfg, ctx, worker.row, 0)
        b, buf = ctx.buffers, worker.buf[0]
        models = {}
        for t in range(ROLLOUT):
            # The learner publishes new weights between every two steps of the rollout.
            fresh = build_model(worker.cfg, ctx.obs_space, ctx.action_space)
            ctx.params[0].publish(flat_state(fresh), t + 10)
            models[t] = fresh
            policy.act_into(buf, t, torch.zeros(ENVS, 0))
            worker._step_group([0])
            worker.t[0] += 1
        assert b.policy_version[buf].tolist() == [[t + 10] * ENVS for t in range(ROLLOUT)]
        for t, model in models.items():
            with torch.no_grad():
                obs = {"obs": b.obs["obs"][buf, t]}
                dist = model._distribution(model._core_step(model._encode(obs), torch.zeros(ENVS, 0))[0], obs)
                want = dist.log_prob(b.actions[buf, t])
                value = model.act({"obs": b.obs["obs"][buf, t]}, torch.zeros(ENVS, 0)).values
            np.testing.assert_allclose(b.behaviour_logp[buf, t].numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(b.behaviour_value[buf, t].numpy(), value.numpy(), rtol=1e-5, atol=1e-6)
    finally:
        for split in worker.splits:
            split.close()


def test_a_restarted_worker_keeps_counting_env_restarts_from_where_its_predecessor_left():
    dead, ctx = _worker()
    for split in dead.splits:
        split.close()
    ctx.board.row("rollout_0").set("env_restarts", 3.0)  # what the dead worker in this slot had counted
    worker = RolloutWorker(dead.cfg, 0, ctx)
    try:
        assert worker._start_splits()
        worker._step_group([0])
        assert ctx.board.get("rollout_0", "env_restarts") == 3.0
    finally:
        for split in worker.splits:
            split.close()


def _remote(rnn_states: torch.Tensor):
    """Rollout worker 0's RemotePolicy, over list queues, in inference epoch 0."""
    ctx = SimpleNamespace(request_queue=ListQueue(), response_queues=[ListQueue()], rnn_states=[rnn_states],
                          buffers=SimpleNamespace(episode_start=torch.zeros(4, ROLLOUT + 1, ENVS, dtype=torch.bool)),
                          inference_epoch=torch.zeros(1, dtype=torch.int64))
    return RemotePolicy(ctx, 0), ctx


def test_after_a_policy_worker_restart_exactly_the_unanswered_requests_are_sent_again():
    rnn = torch.tensor([1.0, 2.0])[:, None, None].repeat(1, ENVS, 3)  # [splits, envs, H]
    policy, ctx = _remote(rnn)
    policy.request(0, 2, 1)
    policy.request(1, 3, 2)
    # A policy worker takes both, answers split 0, writes split 1's GRU state and dies.
    assert ctx.request_queue.get_many() == [(0, 0, 2, 1, 0), (0, 1, 3, 2, 0)]
    rnn[0], rnn[1] = 10.0, 20.0
    ctx.response_queues[0].put((0, 2, 1))
    ctx.response_queues[0].put((1, 0, 0))  # meant for a worker that died in this slot earlier
    assert policy.answered(0.0) == [0]
    assert policy.answered(0.0) == [] and ctx.request_queue.items == []  # no restart yet: nothing re-sent

    ctx.response_queues[0].put((1, 0, 0))
    ctx.inference_epoch[0] = 1  # the supervisor restarted the policy workers
    assert policy.answered(0.0) == []
    assert ctx.request_queue.items == [(0, 1, 3, 2, 1)]
    assert torch.all(rnn[1] == 2.0)  # the GRU state as first sent, not the dead worker's half-written one
    assert torch.all(rnn[0] == 10.0)
    ctx.request_queue.get_many()
    ctx.response_queues[0].put((1, 3, 2))
    assert policy.answered(0.0) == [1]
    assert policy.answered(0.0) == [] and ctx.request_queue.items == []


def test_answers_the_old_policy_workers_sent_are_used_not_asked_for_again():
    policy, ctx = _remote(torch.zeros(2, ENVS, 0))
    policy.request(0, 0, 0)
    policy.request(1, 1, 0)
    ctx.request_queue.get_many()
    ctx.response_queues[0].put((0, 0, 0))  # answered just before its worker died
    ctx.inference_epoch[0] = 1
    assert policy.answered(0.0) == [0]
    assert ctx.request_queue.items == [(0, 1, 1, 0, 1)]
    policy.request(0, 0, 1)  # the next step, sent in the new epoch
    assert ctx.request_queue.items[-1] == (0, 0, 0, 1, 1)


def test_an_env_restarting_itself_counts_as_an_env_restart():
    # A ViZDoom env whose engine died starts a new one itself and says so in info;
    # the run's env_restarts must count it as it counts an env that raised.
    worker, ctx = _worker(env_id="faulty_env:SelfHealing-v0")
    try:
        assert worker._start_splits()
        for _ in range(3):  # each of the ENVS envs heals at its 3rd step
            worker._step_group([0])
            worker.t[0] += 1
        assert ctx.board.get("rollout_0", "env_restarts") == ENVS
    finally:
        for split in worker.splits:
            split.close()


def test_an_env_restart_is_on_the_board_before_its_replacement_is_made():
    # Counted after the step, a restart was lost with a worker killed while the new
    # env (a ViZDoom engine: a process chaos.py watches for) was starting.
    worker, ctx = _worker(env_id="faulty_env:FlakyStep-v0")  # each env raises at its 40th step
    board_at_make = []
    for split in worker.splits:
        def recording_make(i, make=split._make):
            board_at_make.append(ctx.board.row("rollout_0").get("env_restarts"))
            return make(i)
        split._make = recording_make
    try:
        assert worker._start_splits()
        for _ in range(40):
            worker._step_group([0])
        assert board_at_make == [1, 2]  # split 0's two envs, each counted before it was made again
    finally:
        for split in worker.splits:
            split.close()
