"""Policy worker process: gathers the waiting action requests, runs one batched
forward per policy over their observations (read in place from the trajectory
buffers), writes actions back, and tells each rollout worker its split is ready."""
from __future__ import annotations

import queue
import time

import torch

from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.params import device_copies
from fastrl.plumbing.polling import get_many_polling, put_many_polling
from fastrl.plumbing.stats_board import Timer
from fastrl.sampling.inference import PolicyCopy

QUEUE_TIMEOUT_S = 0.1


def policy_worker_main(cfg, index: int, ctx: SharedContext, device: str, device_params: list | None = None) -> None:
    """`device_params`: on a GPU run, each policy's weights on the GPU (plumbing.params)."""
    with device_copies(ctx.params, device_params):
        _serve(cfg, index, ctx, device)


def _serve(cfg, index: int, ctx: SharedContext, device: str) -> None:
    row = ctx.board.row(f"policy_{index}")
    timer = Timer(row)
    # One forward answers at most every split of every worker: the largest CUDA graph.
    max_batch = cfg.num_workers * cfg.num_splits * cfg.envs_per_split
    policies = [PolicyCopy(cfg, ctx, row, device, policy=k, max_batch=max_batch) for k in range(cfg.num_policies)]
    wait_s = cfg.inference_batch_wait_ms / 1000.0
    # Older epochs' requests are stale; their senders re-send them (inference.RemotePolicy).
    epoch = int(ctx.inference_epoch[0])
    while not ctx.stop.is_set():
        row.beat()
        with timer("wait_s"):
            try:
                requests = get_many_polling(ctx.request_queue, QUEUE_TIMEOUT_S)
            except queue.Empty:
                continue
            if wait_s > 0:
                # A short wait buys a bigger batch: worth it where a forward's fixed cost
                # dominates (a GPU), wasted on a CPU.
                time.sleep(wait_s)
                try:
                    requests += ctx.request_queue.get_many(block=False)
                except queue.Empty:
                    pass
            requests = [r[:4] for r in requests if r[4] == epoch]
            if not requests:
                continue
        for k, policy in enumerate(policies):
            mine = [r for r in requests if cfg.policy_of_split(r[1]) == k]
            if mine:
                _answer(cfg, ctx, policy, mine, timer)


def _answer(cfg, ctx: SharedContext, policy: PolicyCopy, requests: list, timer: Timer) -> None:
    """One batched forward of `policy` over these (worker, split, buffer, t) requests,
    its outputs written into the buffers and each worker told."""
    b, n = ctx.buffers, cfg.envs_per_split
    with timer("comm_s"):
        # Gathered straight into the inputs the runner hands out (pinned on a GPU).
        obs, rnn = policy.host_inputs(len(requests) * n)
        for k, v in b.obs.items():
            torch.cat([v[buf, t] for (_, _, buf, t) in requests], out=obs[k])
        torch.cat([ctx.rnn_states[w][s] for (w, s, _, _) in requests], out=rnn)
    with timer("busy_s"):
        actions, logp, values, rnn_out = policy.act_on_host()
    with timer("comm_s"):
        policy.clock.collect()  # act_on_host waited for the copies: both spans have ended
        for i, (w, s, buf, t) in enumerate(requests):
            rows = slice(i * n, (i + 1) * n)
            b.actions[buf, t] = actions[rows]
            b.behaviour_logp[buf, t] = logp[rows]
            b.behaviour_value[buf, t] = values[rows]
            b.policy_version[buf, t] = policy.version
            ctx.rnn_states[w][s] = rnn_out[rows]
            put_many_polling(ctx.response_queues[w], [(s, buf, t)], 10.0)
