"""Where training metrics go: TensorBoard event files (<experiment>/tb) for every run,
and a W&B run with --with_wandb (its id kept in wandb_run_id.txt for resuming).
`scalars_from` is pure, so the mapping from the runner's view to named scalars is
tested without processes; `Monitor` writes them against env frames.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from typing import Optional

from fastrl.config import Config, ConfigError
from fastrl.plumbing.files import NO_SPACE, writing
from fastrl.plumbing.stats_board import per_second

TB_SUBDIR = "tb"
WANDB_ID_FILE = "wandb_run_id.txt"
# TensorBoard renders every text as its own card, so it gets one status line in ten;
# W&B gets every line.
STATUS_TEXT_EVERY = 10

# Learner loss stats (names as the learner sends them) -> logged names.
_LOSS_NAMES = {
    "loss": "loss/total",
    "policy_loss": "loss/policy",
    "value_loss": "loss/value",
    "entropy": "loss/entropy",
    "approx_kl": "loss/approx_kl",
    "clip_fraction": "loss/clip_fraction",
    "explained_variance": "loss/explained_variance",
    "advantage_mean": "loss/advantage_mean",
    "advantage_std": "loss/advantage_std",
    "exploration": "loss/exploration",
    "value_target_mean": "loss/value_target_mean",
    "value_target_std": "loss/value_target_std",
    "grad_norm": "loss/grad_norm",
    "lr": "loss/lr",
    "learner_steps": "train/learner_steps",
    "bad_batches": "data/bad_batches_dropped",  # batches of NaN or inf env data the learner dropped
}
# Board row-name prefixes -> the component name used in perf/ scalars.
_COMPONENTS = {"learner": "learner", "policy_": "policy_worker", "rollout_": "rollout_worker"}


def _mean(values) -> Optional[float]:
    values = list(values)
    return sum(values) / len(values) if values else None


def scalars_from(*, board, metrics: dict, returns, objectives, episodes: int, elapsed: float,
                 window: tuple, frames: Optional[float] = None, trained: Optional[float] = None) -> dict:
    """The scalars of one report, named "group/measure". `window` is (seconds, env
    frames, samples trained) at the previous report, so rates say how fast the run
    goes now; `frames` and `trained` override the board's in a multi-rank run.
    Missing or non-finite values are left out, as NaN breaks curves in both dashboards.
    """
    t0, frames0, trained0 = window
    frames = board.total("env_frames", "rollout_") if frames is None else frames
    trained = board.get("learner", "samples_trained") if trained is None else trained
    received = board.get("learner", "samples_received")
    out = {
        "train/fps": per_second(frames - frames0, elapsed - t0),
        "perf/samples_trained_per_s": per_second(trained - trained0, elapsed - t0),
        "train/episodes": float(episodes),
        "train/return_mean_100": _mean(returns),
        "train/true_objective_100": _mean(objectives),
        "lag/min": board.get("learner", "lag_min"),
        "lag/mean": board.get("learner", "lag_mean"),
        "lag/max": board.get("learner", "lag_max"),
        "lag/p90": board.get("learner", "lag_p90"),
        # Staleness past --max_policy_lag: the share of received samples the learner threw away.
        "lag/dropped_fraction": board.get("learner", "samples_dropped") / received if received else None,
        "perf/env_restarts": board.total("env_restarts"),
        "perf/nonfinite_skips": board.get("learner", "nonfinite_skips"),
        "train/kl_stops": board.get("learner", "kl_stops"),
        # Of --ppo_epochs x --num_minibatches: where --target_kl, not the epochs, sizes the update.
        "train/steps_per_batch": board.get("learner", "batch_steps") if board.get("learner", "learner_steps") else None,
    }
    for key, name in _LOSS_NAMES.items():
        if key in metrics:
            out[name] = float(metrics[key])
    # Busy/wait/comm as a share of wall time per process: what points at the bottleneck.
    for prefix, component in _COMPONENTS.items():
        rows = board.rows_with(prefix)
        if rows and elapsed > 0:
            for field in ("busy_s", "wait_s", "comm_s"):
                share = board.total(field, prefix) / len(rows) / elapsed
                out[f"perf/{component}_{field[:-2]}_fraction"] = share
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise ConfigError("--with_wandb needs wandb: pip install wandb (or pass --with_wandb false).") from None
    return wandb


def _quiet_writer_thread_on_full_disk() -> None:
    """TensorBoard's writer thread re-raises its write error on the next call, which the Monitor
    says in one sentence; the thread's own death would print a second, raw traceback."""
    previous = threading.excepthook
    if getattr(previous, "quiets_full_disk", False):
        return

    def hook(args):
        error = args.exc_value
        if not (isinstance(error, OSError) and error.errno in NO_SPACE
                and type(args.thread).__module__.startswith("tensorboard")):
            previous(args)

    hook.quiets_full_disk = True
    threading.excepthook = hook


class NullMonitor:
    """Where a torchrun rank other than 0 logs: nowhere, since rank 0 logs for the run."""

    def log(self, env_frames: int, wall_seconds: float, scalars: dict, status: Optional[str] = None) -> None:
        pass

    def close(self, exit_code: int = 0) -> None:
        pass


class Monitor:
    """Writes one experiment's scalars to TensorBoard and, with cfg.with_wandb, to W&B.

    resume_frames: env frames of the checkpoint resumed from (0: fresh). TensorBoard
    hides older events past it, as that training is not in the checkpoint, and a
    resumed run continues its W&B run. ConfigError if W&B is asked for and cannot start.
    """

    def __init__(self, cfg: Config, experiment_dir: str, resume_frames: int = 0):
        os.makedirs(experiment_dir, exist_ok=True)
        self._wandb_run = self._open_wandb(cfg, experiment_dir, resume_frames) if cfg.with_wandb else None
        # Imported here: tensorboard's import is slow, and a run refused for a bad config
        # should not pay it.
        from torch.utils.tensorboard import SummaryWriter

        self._tb_dir = os.path.join(experiment_dir, TB_SUBDIR)
        self._tb = SummaryWriter(self._tb_dir, purge_step=int(resume_frames))
        self._status_lines = 0
        _quiet_writer_thread_on_full_disk()

    @staticmethod
    def _open_wandb(cfg: Config, experiment_dir: str, resume_frames: int):
        wandb = _import_wandb()
        id_path = os.path.join(experiment_dir, WANDB_ID_FILE)
        run_id = None
        if resume_frames > 0 and os.path.isfile(id_path):
            with open(id_path) as fh:
                run_id = fh.read().strip() or None
        init = dict(
            project=cfg.wandb_project,
            entity=cfg.wandb_entity or None,
            group=cfg.wandb_group or None,
            tags=[t.strip() for t in cfg.wandb_tags.split(",") if t.strip()] or None,
            name=os.path.basename(os.path.normpath(experiment_dir)),
            config=cfg.to_dict(),
            id=run_id,
            resume="allow",
            # With the experiment unless WANDB_DIR says where all W&B files go.
            dir=None if os.environ.get("WANDB_DIR") else experiment_dir,
        )
        try:
            run = wandb.init(**init)
        except Exception as err:  # noqa: BLE001 - wandb raises many types (no login, no network, bad entity)
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"W&B could not start a run ({first}); run `wandb login`, set WANDB_MODE=offline, "
                              "or drop --with_wandb.") from err
        if run.id != run_id:
            with open(id_path, "w") as fh:
                fh.write(run.id + "\n")
        # Env frames as the x axis rather than W&B's step, which must only grow: a run
        # resumed from an older checkpoint would have its first reports dropped.
        run.define_metric("env_frames")
        run.define_metric("*", step_metric="env_frames")
        return run

    def log(self, env_frames: int, wall_seconds: float, scalars: dict, status: Optional[str] = None) -> None:
        """Record `scalars` at `env_frames`, with wall_seconds and the status line (to
        W&B every time, to TensorBoard every STATUS_TEXT_EVERY-th)."""
        step = int(env_frames)
        row = dict(scalars)
        row["time/wall_seconds"] = float(wall_seconds)
        if self._wandb_run is not None:  # first: a full disk under TensorBoard keeps this row in W&B
            self._wandb_run.log({**row, **({"status": status} if status is not None else {}), "env_frames": step})
        if self._tb is not None:
            self._log_tensorboard(row, step, status)

    def _log_tensorboard(self, row: dict, step: int, status: Optional[str]) -> None:
        """DiskFullError when the event file's disk is full; TensorBoard is dropped then, so that
        the shutdown's last reports (W&B's included) go on without it."""
        try:
            with writing(self._tb_dir, "TensorBoard's event file"):
                for name, value in row.items():
                    self._tb.add_scalar(name, value, step)
                if status is not None:
                    if self._status_lines % STATUS_TEXT_EVERY == 0:
                        self._tb.add_text("status", status, step)
                    self._status_lines += 1
                # Flushed every report (seconds apart), so a killed run loses nothing it printed.
                self._tb.flush()
        except OSError:
            with contextlib.suppress(Exception):
                self._tb.close()
            self._tb = None
            raise

    def close(self, exit_code: int = 0) -> None:
        """Flush and close everything; a non-zero exit_code marks the W&B run failed."""
        tb, self._tb = self._tb, None
        try:
            if tb is not None:
                with writing(self._tb_dir, "TensorBoard's event file"):
                    tb.close()
        finally:
            if self._wandb_run is not None:
                self._wandb_run.finish(exit_code=exit_code)
                self._wandb_run = None
