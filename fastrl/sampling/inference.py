"""Acting with the newest published policy: a model copy that reloads only when the
learner's version moved. Used by policy workers (batched over many splits) and by
rollout workers with `--inference local`; RemotePolicy is a rollout worker's side of
`--inference policy_worker`."""
from __future__ import annotations

import queue

import torch

from fastrl.algo.model import build_model, has_images, load_flat_state
from fastrl.cuda.graphs import make_policy_runner
from fastrl.cuda.timing import DeviceClock
from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.polling import get_many_polling, put_many_polling
from fastrl.plumbing.stats_board import BoardRow
from fastrl.sampling.compiled_act import ACT_COMPILE_KEY, CompiledAct, actors_compile


class PolicyCopy:
    """A read-only copy of one policy's model on `device`. On a GPU it acts through
    CUDA graphs for batches of up to `max_batch` rows, reloading weights in place so
    the graphs stay valid."""

    def __init__(self, cfg, ctx: SharedContext, row: BoardRow, device: str = "cpu", policy: int = 0,
                 max_batch: int = 1):
        self.ctx, self.row = ctx, row
        self.params = ctx.params[policy]
        self.device = torch.device(device)
        self.model = build_model(cfg, ctx.obs_space, ctx.action_space, ctx.precision.acting).to(self.device)
        self.model.eval()
        self.rnn_size = self.model.rnn_state_size
        self._flat = torch.zeros(self.params.flat.shape, device=self.device)
        self.version = -1
        self.refresh()
        self._act = make_policy_runner(self.model, self.device, max_batch)
        self.clock = DeviceClock.for_device(self.device, row)  # the GPU's time for forwards and copies

    def refresh(self) -> None:
        version = self.params.read_if_newer(self.version, self._flat)
        if version != self.version:
            load_flat_state(self.model, self._flat)
            self.model.refresh_acting_copies()  # what a CUDA graph's replay reads
            self.version = version
            self.row.add("policy_reloads", 1)

    @torch.no_grad()
    def act(self, obs: dict, rnn_state: torch.Tensor):
        self.refresh()
        return self._counted(self._act(obs, rnn_state))

    def host_inputs(self, batch: int):
        """(obs, rnn_state) host tensors of `batch` rows to fill for `act_on_host`."""
        return self._act.host_inputs(batch)

    @torch.no_grad()
    def act_on_host(self):
        """act() on the rows `host_inputs` handed out, with the newest weights; the
        outputs on the host, valid until the next call."""
        self.refresh()
        return self._counted(self._act.act_on_host(self.clock))

    def _counted(self, out):
        self.row.add("inference_batches", 1)
        self.row.add("inference_samples", out.actions.shape[0])
        return out


class LocalPolicy(PolicyCopy):
    """Inference inside a rollout worker, one split at a time, its forward compiled
    where --compile_actors says so."""

    def __init__(self, cfg, ctx: SharedContext, row: BoardRow, worker: int, policy: int = 0):
        super().__init__(cfg, ctx, row, policy=policy)
        self.worker, self.policy = worker, policy
        self.compiled = None
        self._report = None  # the compile's report, until the runner's queue took it
        if actors_compile(cfg.compile_actors, has_images(ctx.obs_space), cfg.use_rnn, self.device.type,
                          cfg.inference, ctx.precision.acting):
            self.compiled = CompiledAct(self.model, cfg.compile_actors, beat=row.beat)

    def act_into(self, buf: int, t: int, rnn_state: torch.Tensor) -> torch.Tensor:
        b = self.ctx.buffers
        out = self.act({k: v[buf, t] for k, v in b.obs.items()}, rnn_state)
        b.actions[buf, t] = out.actions
        b.behaviour_logp[buf, t] = out.logp
        b.behaviour_value[buf, t] = out.values
        b.policy_version[buf, t] = self.version
        if self.compiled is not None:
            self._send_compile_report()
        return out.rnn_state

    def _send_compile_report(self) -> None:
        if self._report is None:
            self._report = self.compiled.take_report()
        if self._report is None:
            return
        try:
            self.ctx.metrics_queue.put_many([{ACT_COMPILE_KEY: {**self._report, "worker": self.worker,
                                                                "policy": self.policy}}], block=False)
            self._report = None
        except queue.Full:
            pass  # the runner is behind: the next forward tries again, acting never waits


class RemotePolicy:
    """A rollout worker's side of the policy workers: sends (worker, split, buffer, t,
    epoch) requests, takes the answers, and re-sends what a restart lost.

    The supervisor restarts all policy workers together and moves the epoch on only
    once every old one is dead; new ones drop older epochs' requests. On an epoch
    change this worker takes the old workers' complete answers, then re-sends each
    unanswered request with the GRU state it first sent. So each request is answered
    exactly once, with no timeout: re-sending on a timeout would let a slow worker's
    late answer overwrite state the rollout worker has moved past.
    """

    def __init__(self, ctx: SharedContext, index: int):
        self.ctx, self.index = ctx, index
        self.responses = ctx.response_queues[index]
        self.rnn = ctx.rnn_states[index]  # [splits, n, H], read and written by the policy workers
        self.rnn_sent = self.rnn.clone()  # each split's GRU state as its last request sent it
        self._epoch_now = ctx.inference_epoch.numpy()  # a numpy view: read every poll
        self.epoch = int(self._epoch_now[0])
        self.pending: dict = {}  # split -> (buffer, t, epoch) of its unanswered request

    def request(self, s: int, buf: int, t: int) -> None:
        self.rnn[s] *= ~self.ctx.buffers.episode_start[buf, t, :, None]  # new episodes start from zero
        self.rnn_sent[s] = self.rnn[s]
        self._send(s, buf, t)

    def _send(self, s: int, buf: int, t: int) -> None:
        self.pending[s] = (buf, t, self.epoch)
        put_many_polling(self.ctx.request_queue, [(self.index, s, buf, t, self.epoch)], 10.0)

    def answered(self, timeout: float) -> list:
        """The splits whose actions are written, waiting up to `timeout` for the first."""
        if self._epoch_now[0] != self.epoch:
            return self._after_restart()
        try:
            return self._match(get_many_polling(self.responses, timeout))
        except queue.Empty:
            return []

    def _match(self, responses: list) -> list:
        """The splits these responses answer; others were for a worker that died in
        this slot before this one started."""
        splits = []
        for s, buf, t in responses:
            if s in self.pending and self.pending[s][:2] == (buf, t):
                del self.pending[s]
                splits.append(s)
        return splits

    def _after_restart(self) -> list:
        """Take the old policy workers' last answers, then re-send what they lost."""
        self.epoch = int(self._epoch_now[0])
        answered = []
        while True:  # the old policy workers are all dead: every answer they sent is queued by now
            try:
                answered += self._match(self.responses.get_many(block=False))
            except queue.Empty:
                break
        for s, (buf, t, epoch) in list(self.pending.items()):
            if epoch != self.epoch:
                self.rnn[s] = self.rnn_sent[s]
                self._send(s, buf, t)
        return answered
