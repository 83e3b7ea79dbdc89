"""Learner process: takes full trajectories off the queue, copies a batch out of
shared memory (freeing the buffers), trains on it with the APPO loss, and publishes
the new parameters with a version. Owns the checkpoints.

One learner per policy. In a multi-rank run it is the one process of its rank that
talks to the others (fastrl.plumbing.collectives); rank 0's writes the checkpoints."""
from __future__ import annotations

import dataclasses
import math
import queue
import sys
import time
from typing import NamedTuple, Optional

import numpy as np
import torch

from fastrl.algo.appo_loss import (
    STAT_FIELDS,
    Behaviour,
    Current,
    LossSettings,
    Steps,
    TraceSettings,
    ValueScale,
    appo_loss,
    approx_kl,
    loss_on_targets,
    vtrace_targets,
)
from fastrl.algo.model import build_model, flat_state, flat_state_size, has_images, load_flat_state
from fastrl.algo.vtrace import VTraceReturns
from fastrl.cuda.staging import BatchStager
from fastrl.cuda.timing import DeviceClock
from fastrl.learning.adam import FusedAdam
from fastrl.learning.checkpoint import NonFiniteStateError, checkpoint_dir, load_checkpoint, save_checkpoint
from fastrl.learning.compiled import COMPILE_KEY, COMPILE_STARTED_KEY, CompiledEvaluate, CompileMemory
from fastrl.plumbing import caching_allocator
from fastrl.plumbing.collectives import Peers
from fastrl.plumbing.compiling import auto_compiles, beating
from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.params import device_copies
from fastrl.plumbing.polling import get_many_polling, put_many_polling
from fastrl.plumbing.ranks import SOLO, Rank, local_counts, run_count
from fastrl.plumbing.stats_board import Timer, learner_row
from fastrl.plumbing.timeline import mark

QUEUE_TIMEOUT_S = 0.1
# The metrics message that carries every rank's final weights digest to the runner.
WEIGHTS_KEY = "weights_sha256_by_rank"
# The metrics message that says why the learner's caching allocator could not be used.
ALLOCATOR_KEY = "learner_allocator_unavailable"
METRICS_EVERY_S = 1.0
MAX_NONFINITE_IN_A_ROW = 20


class NonFiniteLossError(RuntimeError):
    pass


class BadDataError(RuntimeError):
    """The env kept sending NaN or inf, past --max_bad_batches batches in a row."""


# The metrics message that counts the batches dropped for non-finite env data.
BAD_BATCHES_KEY = "bad_batches"


class LearnerStart(NamedTuple):
    """Where a learner starts: the checkpoint it resumes (None: fresh) and the run's
    frames before it, its policy, its rank and the options every rank must share (a
    multi-rank run only), what earlier runs learnt of compiling its step, and when the
    command was launched (time.time(); None: now), where --train_for_seconds counts from."""
    resume_path: Optional[str] = None
    frames_offset: int = 0
    policy: int = 0
    rank: Rank = SOLO
    shared_options: Optional[dict] = None
    compile_memory: Optional[CompileMemory] = None
    launched_at: Optional[float] = None


FRESH = LearnerStart()


class Learner:
    """The learner of one policy, started as `start` says."""

    def __init__(self, cfg, ctx: SharedContext, device: str, start: LearnerStart = FRESH):
        resume_path, frames_offset, policy, rank, shared_options, compile_memory, launched_at = start
        self.launched_at = time.time() if launched_at is None else launched_at
        self.cfg, self.ctx, self.rank, self.policy = cfg, ctx, rank, policy
        self.params = ctx.params[policy]
        self.device = torch.device(device)
        if caching_allocator.wanted(cfg.learner_allocator, self.device.type):
            try:
                caching_allocator.install(caching_allocator.learner_cache_bytes())
            except caching_allocator.AllocatorUnavailable as err:
                try:
                    put_many_polling(ctx.metrics_queue, [{ALLOCATOR_KEY: str(err)}], 1.0)
                except queue.Full:
                    pass  # a report only
        self.row = ctx.board.row(learner_row(policy))
        self.timer = Timer(self.row)
        self.frames_offset = frames_offset
        self.model = build_model(cfg, ctx.obs_space, ctx.action_space, ctx.precision.learning)
        # Start from exactly the weights the runner published, which the actors already use.
        load_flat_state(self.model, self.params.flat.clone())
        self.model.to(self.device).train()
        self.clock = DeviceClock.for_device(self.device, self.row)  # the GPU's time for its steps and uploads
        self.stager = BatchStager.for_device(self.device, self.clock)
        self.optimizer = FusedAdam(self.model.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        memory = compile_memory or CompileMemory()
        self.compiled = CompiledEvaluate(self.model, cfg.compile_learner, cfg.exploration_loss == "symmetric_kl",
                                         auto_compiles(has_images(ctx.obs_space), cfg.use_rnn, self.device.type),
                                         memory.prior, memory.setup_key, beat=self.row.beat)
        self.version = self.params.version
        self._hyper_epoch = 0  # the last change of hyperparameters taken (fastrl.plumbing.hyper)
        self.samples_trained = 0
        if resume_path:
            state = load_checkpoint(resume_path)
            self.optimizer.load_state_dict(state["optimizer"])
            # The run's options (saved, or given again on this command line) set the rate, not the
            # state saved with it; under PBT its replayed log sets it next (plumbing.hyper).
            self._set_lr(cfg.lr)
            self.samples_trained = int(state.get("samples_trained", 0))
            if "torch_rng" in state:
                torch.set_rng_state(state["torch_rng"])
        self.row.set("learner_steps", self.version)
        self._nonfinite_in_a_row = 0
        self._bad_batches = self._bad_in_a_row = 0
        self._last_metrics = 0.0
        self._stats_this_batch = False
        self._batch_stats = None  # (loss terms, grad norm) of the due batch's latest step
        self._metrics = {}
        self.peers = self._join(shared_options or {}) if rank.distributed else None

    def _join(self, shared_options: dict) -> Peers:
        """Join the other ranks, check they resume the same checkpoint with the same
        model and options, and start from rank 0's weights."""
        backend = self.cfg.dist_backend
        if backend == "auto":
            backend = "nccl" if self.device.type == "cuda" else "gloo"
        peers = Peers(self.rank, backend, self.cfg.dist_timeout_seconds, self.device, self.row)
        same_folder = ("every rank must see the same experiment folder (one --train_dir on a file system they all "
                       "share), as each resumes from rank 0's newest checkpoint there.")
        peers.check_agreement(
            {"resumed policy version": self.version, "resumed env frame": self.frames_offset,
             "model size": flat_state_size(self.model), **{f"--{k}": v for k, v in shared_options.items()}},
            {"resumed policy version": same_folder, "resumed env frame": same_folder},
            "start every rank with the same command and options.")
        flat = peers.broadcast_(flat_state(self.model))
        load_flat_state(self.model, flat)
        return peers

    def run(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        pending: list = []
        last_checkpoint = time.time()
        first = True  # the first batch's marks, for benchmarks/startup.py
        mark("learner: ready")
        try:
            while True:
                self.row.beat()
                stopping = ctx.stop.is_set()
                if not stopping:
                    with self.timer("wait_s"):
                        try:
                            pending += get_many_polling(ctx.traj_queues[self.policy], QUEUE_TIMEOUT_S,
                                                        cfg.buffers_per_batch - len(pending))
                        except queue.Empty:
                            continue
                    if len(pending) < cfg.buffers_per_batch:
                        continue
                if self._stop_agreed(stopping):
                    break
                with self.timer("comm_s"):
                    host = ctx.buffers.gather(pending)
                    bad = self._bad_data(host)
                    # On a GPU the upload runs on a side stream from here on.
                    upload = None if bad else self.stager.start(host)
                    if bad or not cfg.frees_after_training:
                        put_many_polling(ctx.free_queue, pending, 10.0)
                        pending = []
                if bad:
                    self._drop_bad_batch(bad)
                    continue
                self._bad_in_a_row = 0
                self.row.add("samples_received", cfg.batch_size)
                if first:
                    mark("learner: first batch gathered")
                if ctx.hyper is not None:
                    self._take_hyper()
                batch = self.stager.finish(upload)  # the GPU's clock starts after the upload
                with self.timer("busy_s"), self.clock.span("gpu_s"):
                    self.train_on(batch)
                self.clock.collect()
                if cfg.frees_after_training:  # sampling resumes with the weights just published
                    put_many_polling(ctx.free_queue, pending, 10.0)
                    pending = []
                if first:
                    mark("learner: first batch trained")
                    first = False
                threads = int(ctx.learner_threads[0])
                if threads != torch.get_num_threads():
                    torch.set_num_threads(threads)  # the runner's adapter moved a core to or from the learner
                if self.rank.main and time.time() - last_checkpoint >= cfg.checkpoint_every_seconds:
                    with beating(self.row.beat):  # a large model's save is slow, not hung
                        self.save()
                    last_checkpoint = time.time()
            if self.peers is not None:
                self._report_weights()
        finally:
            if self.peers is not None:
                self.peers.leave()
            if self.rank.main:
                self._final_save()

    def _stop_agreed(self, stopping: bool) -> bool:
        """Whether to stop before the next batch; in a multi-rank run agreed with every
        rank (summing the runners' counters too), so all leave after the same step."""
        if self.peers is None:
            return stopping
        stop, summed = self.peers.agree(stopping, local_counts(self.ctx.board))
        self.ctx.totals.write(summed, stop)
        return stop

    def _report_weights(self) -> None:
        """Every rank's weights digest, so summary.json shows they ended bit-identical."""
        digests = self.peers.weights_digests(self.model)
        if self.rank.main:
            try:
                put_many_polling(self.ctx.metrics_queue, [{WEIGHTS_KEY: digests}], 1.0)
            except queue.Full:
                pass  # a report only

    def run_frames(self) -> int:
        """Env frames of the whole run so far: every rank's, from the start of training."""
        return int(run_count(self.ctx.board, self.ctx.totals, "env_frames")) + self.frames_offset

    def _final_save(self) -> None:
        """The checkpoint at exit, unless the state went non-finite: the newest good one then stays newest."""
        try:
            self.save()
        except NonFiniteStateError as err:
            print(f"fastrl: {learner_row(self.policy)}: the final checkpoint is not written: {err}", file=sys.stderr,
                  flush=True)

    def _bad_data(self, batch: dict) -> list:
        """What of the env's data in `batch` is not finite (nonfinite_fields). A multi-rank run,
        whose ranks must take every step together, leaves it to the agreed skip of a
        non-finite step instead (_descend), the normalisers refusing such statistics."""
        return nonfinite_fields(batch) if self.peers is None else []

    def _drop_bad_batch(self, fields: list) -> None:
        """Count a batch dropped for non-finite `fields`; BadDataError past --max_bad_batches in a row."""
        self._bad_batches += 1
        self._bad_in_a_row += 1
        report = {BAD_BATCHES_KEY: self._bad_batches}
        if self.policy != 0:
            report["policy"] = self.policy
        try:
            put_many_polling(self.ctx.metrics_queue, [report], 1.0)
        except queue.Full:
            pass  # a report only; the next one carries the count
        if self._bad_in_a_row > self.cfg.max_bad_batches:
            raise BadDataError(
                f"{self.cfg.env} sent non-finite {' and '.join(fields)} (NaN or inf) in {self._bad_in_a_row} batches "
                f"in a row, past --max_bad_batches {self.cfg.max_bad_batches}; fix the env, or wrap it to clean its "
                "output.")

    def train_on(self, batch: dict) -> None:
        cfg = self.cfg
        lag, valid = lag_mask(self.version, batch["policy_version"], cfg.max_policy_lag)
        self._record_lag(lag, valid)
        if cfg.normalize_obs:
            # Only the samples trained on: a dropped one came from a stale policy.
            self.model.update_normalizer({k: v[:-1] for k, v in batch["obs"].items()}, keep=valid.bool(),
                                         reduce=self.peers.sum_ if self.peers is not None else None)
        if cfg.lr_schedule == "linear":
            # Every rank's frames, as of the last agreement: the same count on every rank
            # (a time budget, read off each rank's own clock, is refused under torchrun).
            self._set_lr(scheduled_lr(cfg, self.run_frames(), time.time() - self.launched_at))

        bounded = cfg.target_kl > 0 and cfg.ppo_epochs * cfg.num_minibatches > 1
        samples = None  # single-sample minibatches' rows, with their targets (--minibatch_split samples)
        if cfg.minibatches_of_samples:
            # With the weights before the batch's first step, so on policy the targets
            # are GAE(lambda)'s, fixed for every pass, as in PPO.
            samples = flat_samples(batch, valid)
            targets, start_log_ratio = batch_targets(cfg, self.model, batch, valid)
            samples.update(vs=targets.vs_tm1.flatten(), pg_advantage=targets.pg_advantage_t.flatten())
            if bounded:
                samples["start_log_ratio"] = start_log_ratio.flatten()
        elif bounded:
            batch = {**batch, "start_log_ratio": start_log_ratios(self.model, batch)}
        self._stats_this_batch = self._metrics_due()
        taken = 0
        for stepped in self._passes(batch, valid, samples):
            if not stepped:  # the KL bound refused it: no step past it either
                self.row.add("kl_stops", 1)
                break
            taken += 1
        self.row.add("gradient_steps", taken)
        self.row.set("batch_steps", taken)
        if self._batch_stats is not None:
            self._note_metrics(*self._batch_stats)
            self._batch_stats = None
        trained = int(valid.sum().item())
        self.samples_trained += trained
        self.row.add("samples_trained", trained)
        self.version += 1
        self.row.set("learner_steps", self.version)
        self.params.publish(flat_state(self.model), self.version)
        self._send_compile_news()

    def _passes(self, batch: dict, valid: torch.Tensor, samples: Optional[dict]):
        """The batch's --ppo_epochs passes, lazily: yields whether each step was
        taken (False: the KL bound refused it)."""
        cfg, dev = self.cfg, self.device
        T, B = batch["rewards"].shape
        for _ in range(cfg.ppo_epochs):
            if cfg.num_minibatches == 1:  # the whole batch, in place: no copy of its frames
                yield self._gradient_step(batch, valid)
            elif samples is not None:
                for rows in torch.randperm(T * B, device=dev).chunk(cfg.num_minibatches):
                    yield self._sample_step({k: _rows(v, rows) for k, v in samples.items()})
            else:
                for cols in torch.randperm(B, device=dev).chunk(cfg.num_minibatches):
                    yield self._gradient_step(_columns(batch, cols), valid[:, cols])

    def _gradient_step(self, mb: dict, valid: torch.Tensor) -> bool:
        """One step on a minibatch of trajectories; False if the KL bound refused it."""
        self.compiled.before_step(mb)
        start = time.perf_counter()
        out, grad_norm = gradient_step(self.cfg, self.model, self.optimizer, mb, valid, self.peers,
                                       stats=self._stats_this_batch)
        self.compiled.after_step(time.perf_counter() - start)
        return self._stepped(out, grad_norm)

    def _send_compile_news(self) -> None:
        """The compile's start and choice, once each, sent after the batch is counted."""
        news = []
        started = self.compiled.take_started()
        if started:
            news.append({COMPILE_STARTED_KEY: started})
        report = self.compiled.take_report()
        if report is not None:
            news.append({COMPILE_KEY: report})
        if news and self.policy == 0:  # every policy's learner compiles alike; one says it
            try:
                put_many_polling(self.ctx.metrics_queue, news, 1.0)
            except queue.Full:
                pass  # a report only

    def _sample_step(self, samples: dict) -> bool:
        """One step on single samples; False if the KL bound refused it."""
        return self._stepped(*sample_gradient_step(self.cfg, self.model, self.optimizer, samples, self.peers,
                                                   stats=self._stats_this_batch))

    def _stepped(self, out, grad_norm) -> bool:
        """Count a skipped (non-finite) step or keep its statistics for the batch's report; False if refused."""
        if grad_norm is None:
            return False
        if out is None:
            self._skip_nonfinite()
            return True
        self._nonfinite_in_a_row = 0
        if out.approx_kl is not None:  # a step of a batch whose statistics are due
            self._batch_stats = (out, grad_norm)
        return True

    def _take_hyper(self) -> None:
        """Take the hyperparameters (and maybe another policy's weights) that PBT gave
        this policy; Adam's moments start afresh with new weights."""
        change = self.ctx.hyper.take(self.policy, self._hyper_epoch)
        if change is None:
            return
        self._hyper_epoch, values, source = change
        self.cfg = dataclasses.replace(self.cfg, **values)
        self._set_lr(self.cfg.lr)
        if source is not None:
            flat = torch.zeros_like(self.ctx.params[source].flat)
            self.ctx.params[source].read_if_newer(-2, flat)  # -2: no version, so always a copy
            load_flat_state(self.model, flat.to(self.device))
            self.optimizer.state.clear()

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _skip_nonfinite(self) -> None:
        self.row.add("nonfinite_skips", 1)
        self._nonfinite_in_a_row += 1
        if self._nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
            raise NonFiniteLossError(
                f"the loss or its gradient was not finite in {self._nonfinite_in_a_row} updates in a row; "
                "lower --lr or --max_grad_norm, or check the env's rewards and observations for inf/nan")

    def _record_lag(self, lag: torch.Tensor, valid: torch.Tensor) -> None:
        lag_np = lag.flatten().cpu().numpy()
        self.row.set("lag_min", float(lag_np.min()))
        self.row.set("lag_mean", float(lag_np.mean()))
        self.row.set("lag_max", float(lag_np.max()))
        self.row.set("lag_p90", float(np.percentile(lag_np, 90)))
        self.row.add("samples_dropped", float((1.0 - valid).sum()))

    def _metrics_due(self) -> bool:
        """Whether the next batch reports its loss statistics (every METRICS_EVERY_S): those
        of its last step taken, after the passes moved the policy. Its first step's would
        show an on-policy batch's KL and clip fraction as 0, the policy not yet moved."""
        return time.time() - self._last_metrics >= METRICS_EVERY_S

    def _note_metrics(self, out, grad_norm) -> None:
        self._last_metrics = time.time()
        metrics = {name: float(getattr(out, name)) for name in STAT_FIELDS}
        metrics.update(loss=out.total.item(), grad_norm=grad_norm.item(), lr=self.optimizer.param_groups[0]["lr"],
                       learner_steps=self.version)
        if self.cfg.num_policies > 1:
            metrics = {"policy": self.policy, **metrics}
        try:
            self.ctx.metrics_queue.put(metrics, block=False)
        except queue.Full:
            pass  # metrics are a report, never a reason to stall training

    def save(self) -> str:
        state = {
            "model": {k: v.cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "env_frames": self.run_frames(),
            "samples_trained": self.samples_trained,
            "env": self.cfg.env,
            "config": self.cfg.to_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        return save_checkpoint(checkpoint_dir(self.cfg, self.policy), state, self.version, self.cfg.keep_checkpoints)


def scheduled_lr(cfg, run_frames: int, seconds: float) -> float:
    """--lr as --lr_schedule has it `run_frames` and `seconds` into the run: 'linear'
    falls to 0 where the run ends, at its frame or time budget, whichever comes first."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr * max(0.0, 1.0 - max(cfg.budget_done(run_frames, seconds).values(), default=0.0))


def nonfinite_fields(batch: dict) -> list:
    """What of an env's data in a gathered batch holds a NaN or inf: "rewards", "observations"
    (a key's name follows where the env has several); the final observations of cut episodes
    count as observations. Integer observations (image frames) cannot, and are not read."""
    found = [] if bool(torch.isfinite(batch["rewards"]).all()) else ["rewards"]
    for key, obs in batch["obs"].items():
        if obs.is_floating_point() and not all(bool(torch.isfinite(t).all()) for t in (obs, batch["final_obs"][key])):
            found.append("observations" if key == "obs" else f"observations {key!r}")
    return found


def lag_mask(learner_version: int, policy_version_t: torch.Tensor, max_policy_lag: int):
    """(lag_t, valid_t), float [T, B]: each sample's policy lag in learner steps, and
    1 where it is at most `max_policy_lag`."""
    lag_t = (learner_version - policy_version_t).float()
    return lag_t, (lag_t <= max_policy_lag).float()


def gradient_step(cfg, model, optimizer, mb: dict, valid: torch.Tensor, peers: Optional[Peers] = None,
                  loss=None, stats: bool = True):
    """One APPO gradient step on a time-major minibatch (the learner's, and what the
    profiler times). Returns (loss terms, grad norm); (None, grad norm) when skipped
    for a non-finite loss; (loss terms, None) when past --target_kl. `loss` replaces
    trajectory_loss (e.g. a compiled one). With `peers`, every rank takes the same step."""
    out = (loss or trajectory_loss)(cfg, model, mb, valid, stats=stats)
    return _descend(cfg, model, optimizer, out, valid, peers, kl_bound_crossed(cfg, out, mb, valid))


def trajectory_loss(cfg, model, mb: dict, valid: torch.Tensor, time_limits=None, stats: bool = True):
    """appo_loss of a time-major minibatch under the current weights. `time_limits`
    replaces _time_limits (a compiled loss runs it eagerly, being data-dependent)."""
    symmetric_kl = cfg.exploration_loss == "symmetric_kl"
    ev = model.evaluate(mb["obs"], mb["rnn_state0"], mb["episode_start"], mb["actions"], uniform_kl=symmetric_kl)
    terminated, truncated, v_final = (time_limits or _time_limits)(cfg, model, mb, ev)
    steps = Steps(learned_rewards(cfg, mb["rewards"]), terminated.float(), truncated.float(), v_final, valid)
    return appo_loss(ev.logp, Current(ev.values, ev.entropy, ev.uniform_kl),
                     Behaviour(mb["behaviour_logp"], mb["behaviour_value"]), steps, trace_settings(cfg),
                     loss_settings(cfg), ValueScale(*model.value_scale()), stats=stats)


def trace_settings(cfg) -> TraceSettings:
    return TraceSettings(cfg.gamma, cfg.rho_bar, cfg.c_bar, cfg.vtrace_lambda)


def loss_settings(cfg) -> LossSettings:
    return LossSettings(cfg.clip_ratio, cfg.value_coef, cfg.entropy_coef, cfg.normalize_advantages,
                        cfg.value_clip if cfg.value_clip > 0 else None)


def kl_bound_crossed(cfg, out, mb: dict, valid: torch.Tensor) -> bool:
    """Whether the policy has moved past --target_kl from its batch's start on this
    minibatch. Estimated on the acting policy's samples without reweighting: the
    bound is a brake, not a measurement."""
    if "start_log_ratio" not in mb:
        return False
    return bool(approx_kl(out.log_ratio_t - mb["start_log_ratio"], valid) > cfg.target_kl)


def _descend(cfg, model, optimizer, out, valid: torch.Tensor, peers: Optional[Peers], over_kl: bool = False):
    """Backward, the gradient averaged over ranks and clipped, the optimiser step and
    the return normaliser's update. Returns as gradient_step does."""
    if over_kl and peers is None:
        return out, None  # no backward for a step that will not be taken
    optimizer.zero_grad(set_to_none=True)
    out.total.backward()
    finite_loss = bool(torch.isfinite(out.total))
    norm = model.return_norm
    moments = norm.moments(out.vs_tm1[valid > 0]) if norm is not None else None
    if peers is not None:
        # Every rank takes the same step: skip and refusal flags and the return
        # normaliser's moments ride on the gradient's all-reduce, as on a small model
        # each collective costs its latency.
        samples = float(valid.sum())
        _, (nonfinite, refused), moments = peers.average_gradients(
            model.parameters(), samples, [0.0 if finite_loss else 1.0, float(over_kl)], moments)
        finite_loss = nonfinite == 0
        if refused > 0:
            optimizer.zero_grad(set_to_none=True)
            return out, None
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if not (finite_loss and torch.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        return None, grad_norm
    optimizer.step()
    if norm is not None:
        norm.merge(moments)
    return out, grad_norm


def learned_rewards(cfg, r_t: torch.Tensor) -> torch.Tensor:
    """Rewards scaled by --reward_scale, then clipped to +-reward_clip if set."""
    r_t = r_t * cfg.reward_scale
    return r_t.clamp(-cfg.reward_clip, cfg.reward_clip) if cfg.reward_clip > 0 else r_t


def _time_limits(cfg, model, mb: dict, ev):
    """(terminated, truncated, v_final): a time-limit cut either bootstrapped from the
    final observation's value or treated as an episode end."""
    if cfg.bootstrap_time_limits:
        return mb["terminated"], mb["truncated"], final_values(model, mb, ev)
    return mb["terminated"] | mb["truncated"], torch.zeros_like(mb["truncated"]), torch.zeros_like(mb["rewards"])


@torch.no_grad()
def batch_targets(cfg, model, batch: dict, valid: torch.Tensor):
    """(V-trace targets [T, B] in return units, log pi / mu [T, B]) of a whole batch
    under the current weights: what --minibatch_split samples trains towards, and
    where its KL bound is measured from."""
    ev = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"])
    value_mean, value_std = model.value_scale()
    terminated, truncated, v_final = _time_limits(cfg, model, batch, ev)
    log_ratio_t = ev.logp - batch["behaviour_logp"]
    steps = Steps(learned_rewards(cfg, batch["rewards"]), terminated.float(), truncated.float(), v_final, valid)
    targets = vtrace_targets(ev.values * value_std + value_mean, log_ratio_t, steps, trace_settings(cfg))
    return targets, log_ratio_t


@torch.no_grad()
def start_log_ratios(model, batch: dict) -> torch.Tensor:
    """log pi / mu [T, B] under the weights at the batch's start, for --target_kl."""
    ev = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"])
    return ev.logp - batch["behaviour_logp"]


def flat_samples(batch: dict, valid: torch.Tensor) -> dict:
    """The batch's T x B acting steps as single samples [T * B, ...], for
    sample_gradient_step once their targets are added."""
    return {
        "obs": {k: v[:-1].flatten(0, 1) for k, v in batch["obs"].items()},
        "actions": batch["actions"].flatten(0, 1),
        "behaviour_logp": batch["behaviour_logp"].flatten(),
        "behaviour_value": batch["behaviour_value"].flatten(),
        "valid": valid.flatten(),
    }


def sample_gradient_step(cfg, model, optimizer, samples: dict, peers: Optional[Peers] = None, stats: bool = True):
    """One gradient step on single samples whose targets were computed over whole
    trajectories; returns as gradient_step does."""
    symmetric_kl = cfg.exploration_loss == "symmetric_kl"
    logp, entropy, values, uniform_kl = model.evaluate_samples(samples["obs"], samples["actions"], symmetric_kl)
    row = {k: v.unsqueeze(0) for k, v in samples.items() if k not in ("obs", "actions")}
    current = Current(values.unsqueeze(0), entropy.unsqueeze(0),
                      uniform_kl.unsqueeze(0) if uniform_kl is not None else None)
    out = loss_on_targets((logp - samples["behaviour_logp"]).unsqueeze(0), current,
                          VTraceReturns(row["vs"], row["pg_advantage"]), row["valid"], loss_settings(cfg),
                          behaviour_v_tm1=row["behaviour_value"], value_scale=ValueScale(*model.value_scale()),
                          stats=stats)
    return _descend(cfg, model, optimizer, out, row["valid"], peers, kl_bound_crossed(cfg, out, row, row["valid"]))


def _rows(value, rows: torch.Tensor):
    if isinstance(value, dict):
        return {k: v[rows] for k, v in value.items()}
    return value[rows]


@torch.no_grad()
def final_values(model, mb: dict, ev) -> torch.Tensor:
    """Value of each time-limit-truncated episode's last obs in return units (zeros
    elsewhere): the bootstrap a cut episode is owed."""
    truncated = mb["truncated"]
    v_final = torch.zeros_like(mb["rewards"])
    if not truncated.any():
        return v_final
    t_idx, b_idx = truncated.nonzero(as_tuple=True)
    rows = mb["final_row"][t_idx, b_idx]
    obs = {k: v[rows] for k, v in mb["final_obs"].items()}
    # The GRU state carried out of step t, before the reset the next episode applies.
    rnn = ev.rnn_states[t_idx + 1, b_idx]
    value_mean, value_std = model.value_scale()
    v_final[t_idx, b_idx] = model.values_with_state(obs, rnn) * value_std + value_mean
    return v_final


def _columns(batch: dict, cols: torch.Tensor) -> dict:
    """The same env columns of every time-major tensor (rnn_state0 is [B, H]);
    final_obs rows are shared, addressed through final_row."""
    out = {}
    for k, v in batch.items():
        if k == "final_obs":
            out[k] = v
        elif isinstance(v, dict):  # indexing keeps channels-last images so; index_select would not
            out[k] = {kk: vv[:, cols] for kk, vv in v.items()}
        elif k == "rnn_state0":
            out[k] = v.index_select(0, cols)
        else:
            out[k] = v.index_select(1, cols)
    return out


def learner_main(cfg, ctx: SharedContext, device: str, start: LearnerStart,
                 device_params: Optional[list] = None) -> None:
    """`device_params`: on a GPU run, each policy's weights on the GPU (plumbing.params)."""
    with device_copies(ctx.params, device_params):
        Learner(cfg, ctx, device, start).run()
