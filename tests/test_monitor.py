"""Monitoring: the scalar mapping, TensorBoard files read back, and W&B offline runs
read back from the .wandb files they leave on disk."""
import errno
import glob
import json
import math
import os
import struct
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fastrl.config import Config, ConfigError
from fastrl.plumbing.files import DiskFullError
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.runtime.monitor import STATUS_TEXT_EVERY, WANDB_ID_FILE, Monitor, scalars_from

ROWS = ["runner", "learner", "policy_0", "rollout_0", "rollout_1"]


def _board() -> StatsBoard:
    board = StatsBoard(ROWS)
    for name, frames, busy, wait in (("rollout_0", 3000, 8.0, 1.0), ("rollout_1", 5000, 6.0, 3.0)):
        row = board.row(name)
        row.set("env_frames", frames)
        row.set("busy_s", busy)
        row.set("wait_s", wait)
    row = board.row("rollout_1")
    row.set("env_restarts", 2)
    learner = board.row("learner")
    for field, value in (("samples_trained", 900), ("samples_received", 1000), ("samples_dropped", 100),
                         ("lag_min", 0), ("lag_mean", 1.5), ("lag_max", 4), ("lag_p90", 3), ("busy_s", 9.0),
                         ("comm_s", 0.5), ("learner_steps", 7), ("batch_steps", 12)):
        learner.set(field, value)
    board.row("policy_0").set("busy_s", 2.0)
    return board


def test_scalars_from_maps_every_source():
    metrics = {"policy_loss": -0.1, "value_loss": 0.5, "entropy": 0.69, "approx_kl": 0.01, "clip_fraction": 0.2,
               "explained_variance": 0.3, "loss": 0.4, "grad_norm": 1.5, "lr": 3e-4, "learner_steps": 7}
    out = scalars_from(board=_board(), metrics=metrics, returns=[10.0, 20.0], objectives=[1.0], episodes=5,
                       elapsed=10.0, window=(6.0, 4000, 100))
    assert out == pytest.approx({
        "train/fps": (8000 - 4000) / 4.0,
        "perf/samples_trained_per_s": (900 - 100) / 4.0,
        "train/episodes": 5.0,
        "train/return_mean_100": 15.0,
        "train/true_objective_100": 1.0,
        "train/learner_steps": 7.0,
        "lag/min": 0.0, "lag/mean": 1.5, "lag/max": 4.0, "lag/p90": 3.0,
        "lag/dropped_fraction": 0.1,
        "perf/env_restarts": 2.0,
        "perf/nonfinite_skips": 0.0,
        "train/kl_stops": 0.0,
        "train/steps_per_batch": 12.0,
        "loss/policy": -0.1, "loss/value": 0.5, "loss/entropy": 0.69, "loss/approx_kl": 0.01,
        "loss/clip_fraction": 0.2, "loss/explained_variance": 0.3, "loss/total": 0.4, "loss/grad_norm": 1.5,
        "loss/lr": 3e-4,
        "perf/learner_busy_fraction": 0.9, "perf/learner_wait_fraction": 0.0, "perf/learner_comm_fraction": 0.05,
        "perf/policy_worker_busy_fraction": 0.2, "perf/policy_worker_wait_fraction": 0.0,
        "perf/policy_worker_comm_fraction": 0.0,
        "perf/rollout_worker_busy_fraction": 0.7, "perf/rollout_worker_wait_fraction": 0.2,
        "perf/rollout_worker_comm_fraction": 0.0,
    })


def test_scalars_from_leaves_out_what_is_unknown():
    out = scalars_from(board=StatsBoard(["runner", "learner", "rollout_0"]), metrics={"explained_variance": math.nan},
                       returns=[], objectives=[], episodes=0, elapsed=0.0, window=(0.0, 0, 0))
    for absent in ("train/return_mean_100", "train/true_objective_100", "lag/dropped_fraction",
                   "loss/explained_variance", "perf/learner_busy_fraction", "perf/policy_worker_busy_fraction"):
        assert absent not in out
    assert out["train/fps"] == 0.0 and all(math.isfinite(v) for v in out.values())


# --- TensorBoard -------------------------------------------------------------------------

def _tb(exp_dir: str) -> EventAccumulator:
    acc = EventAccumulator(os.path.join(exp_dir, "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_events_hold_the_logged_scalars_and_status(tmp_path):
    exp = str(tmp_path / "exp")
    mon = Monitor(Config(env="CartPole-v1"), exp)
    for i in range(STATUS_TEXT_EVERY + 1):
        mon.log(1000 * (i + 1), 2.0 * (i + 1), {"train/return_mean_100": float(i), "loss/policy": -0.5},
                status=f"line {i}")
    mon.close()
    acc = _tb(exp)
    returns = acc.Scalars("train/return_mean_100")
    assert [e.step for e in returns] == [1000 * (i + 1) for i in range(STATUS_TEXT_EVERY + 1)]
    assert [e.value for e in returns] == [float(i) for i in range(STATUS_TEXT_EVERY + 1)]
    assert acc.Scalars("time/wall_seconds")[-1].value == pytest.approx(2.0 * (STATUS_TEXT_EVERY + 1))
    assert acc.Scalars("loss/policy")[0].value == pytest.approx(-0.5)
    # add_text stores a string tensor under "<tag>/text_summary": the first line and the 11th.
    texts = acc.Tensors("status/text_summary")
    assert [(t.step, t.tensor_proto.string_val[0].decode()) for t in texts] == \
        [(1000, "line 0"), (1000 * (STATUS_TEXT_EVERY + 1), f"line {STATUS_TEXT_EVERY}")]
    assert not os.path.exists(os.path.join(exp, WANDB_ID_FILE))


def test_resumed_run_hides_events_past_its_checkpoint(tmp_path):
    exp = str(tmp_path / "exp")
    first = Monitor(Config(env="CartPole-v1"), exp)
    for frames in (100, 200, 300):
        first.log(frames, 1.0, {"train/fps": float(frames)})
    first.close()
    resumed = Monitor(Config(env="CartPole-v1"), exp, resume_frames=200)
    resumed.log(250, 1.0, {"train/fps": 250.0})
    resumed.close()
    assert [(e.step, e.value) for e in _tb(exp).Scalars("train/fps")] == [(100, 100.0), (250, 250.0)]


# --- W&B offline ---------------------------------------------------------------------------

def _wandb_records(path: str):
    """Yield the protobuf Records of a .wandb file, using wandb's own Record schema.

    wandb 0.31 keeps no Python reader for these files (its Go core writes them), and
    offline runs write no wandb-summary.json, so this decodes the container: a 7-byte
    header (":W&B", a 2-byte ident, a version byte), then LevelDB-log records in
    32 KiB blocks, each record a 7-byte header (CRC32C, length uint16 LE, type:
    1 full, 2 first, 3 middle, 4 last) and its bytes; a block's tail shorter than a
    header is zero padding.
    """
    from wandb.proto import wandb_internal_pb2

    block = 32 * 1024
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:  # zero padding to the end of the block
            pos += room - 7
            continue
        pending += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _read_offline_run(wandb_dir: str, run_id: str, timeout: float = 20.0) -> dict:
    """_read_offline_run_once, retried while the run record is missing: wandb's
    service process may still be writing the file when finish() returns, which a
    loaded machine makes visible."""
    import time

    deadline = time.time() + timeout
    previous = None
    while True:
        run = _read_offline_run_once(wandb_dir, run_id)
        if (run["project"] is not None and run == previous) or time.time() > deadline:
            assert run["files"], f"no offline run {run_id} under {wandb_dir}"
            return run  # two identical reads in a row: the writer is done
        previous = run
        time.sleep(0.5)


def _read_offline_run_once(wandb_dir: str, run_id: str) -> dict:
    """Config, tags, group and history rows of every offline run dir of `run_id`.

    A resumed run gets a dir of its own, suffixed -1, -2, ... when it starts in the
    same second as the previous one; the timestamp in the name orders them.
    """
    def order(path):
        stamp, _, suffix = os.path.basename(os.path.dirname(path))[len("offline-run-"):].partition(f"-{run_id}")
        return stamp, int(suffix.lstrip("-") or 0)

    paths = sorted(glob.glob(os.path.join(wandb_dir, "wandb", f"offline-run-*-{run_id}*", f"run-{run_id}.wandb")),
                   key=order)
    run = {"project": None, "group": None, "tags": [], "config": {}, "history": [], "files": len(paths)}
    for path in paths:
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.update(project=record.run.project, group=record.run.run_group, tags=list(record.run.tags))
                run["config"].update({u.key: json.loads(u.value_json) for u in record.run.config.update})
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
            elif kind == "history":
                run["history"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                       for i in record.history.item})
    return run


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B in offline mode with every file it writes under tmp_path; returns WANDB_DIR."""
    wandb_dir = tmp_path / "wandb_home"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(wandb_dir))
    import wandb

    # wandb reads these variables once per process into a global setup; tearing it
    # down makes each test's run go to that test's own folder.
    wandb.teardown()
    yield str(wandb_dir)
    wandb.teardown()


def _wandb_cfg() -> Config:
    return Config(env="CartPole-v1", with_wandb=True, wandb_project="fastrl-test", wandb_group="grp",
                  wandb_tags="cartpole, baseline", lr=1e-3)


def test_wandb_offline_run_holds_config_metrics_and_status(tmp_path, offline_wandb):
    exp = str(tmp_path / "exp")
    mon = Monitor(_wandb_cfg(), exp)
    mon.log(1000, 1.5, {"train/return_mean_100": 12.5, "loss/entropy": 0.6}, status="status one")
    mon.log(2000, 3.0, {"train/return_mean_100": 20.0, "loss/entropy": 0.5})
    mon.close()
    run_id = open(os.path.join(exp, WANDB_ID_FILE)).read().strip()
    run = _read_offline_run(offline_wandb, run_id)
    assert (run["project"], run["group"], run["tags"]) == ("fastrl-test", "grp", ["cartpole", "baseline"])
    assert run["config"]["lr"] == 1e-3 and run["config"]["env"] == "CartPole-v1"
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run["history"]]
    assert rows == [
        {"env_frames": 1000, "train/return_mean_100": 12.5, "loss/entropy": 0.6, "time/wall_seconds": 1.5,
         "status": "status one"},
        {"env_frames": 2000, "train/return_mean_100": 20.0, "loss/entropy": 0.5, "time/wall_seconds": 3.0},
    ]


def test_wandb_resume_continues_the_run_and_a_fresh_start_does_not(tmp_path, offline_wandb):
    exp = str(tmp_path / "exp")
    first = Monitor(_wandb_cfg(), exp)
    first.log(1000, 1.0, {"train/fps": 1.0})
    first.close()
    run_id = open(os.path.join(exp, WANDB_ID_FILE)).read().strip()

    resumed = Monitor(_wandb_cfg(), exp, resume_frames=1000)
    resumed.log(1500, 2.0, {"train/fps": 2.0})
    resumed.close(exit_code=1)
    assert open(os.path.join(exp, WANDB_ID_FILE)).read().strip() == run_id
    run = _read_offline_run(offline_wandb, run_id)
    assert run["files"] == 2
    assert [(row["env_frames"], row["train/fps"]) for row in run["history"]] == [(1000, 1.0), (1500, 2.0)]

    fresh = Monitor(_wandb_cfg(), exp)
    fresh.close()
    assert open(os.path.join(exp, WANDB_ID_FILE)).read().strip() != run_id


def test_with_wandb_without_wandb_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ConfigError, match="--with_wandb needs wandb: pip install wandb"):
        Monitor(_wandb_cfg(), str(tmp_path / "exp"))


def test_a_wandb_run_that_cannot_start_is_one_clear_error(tmp_path, offline_wandb, monkeypatch):
    import wandb

    def refuse(**_):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    refused = r"W&B could not start a run \(api_key not configured \(no-tty\)\); run `wandb login`"
    with pytest.raises(ConfigError, match=refused):
        Monitor(_wandb_cfg(), str(tmp_path / "exp"))


def test_a_full_disk_under_tensorboard_is_said_once_and_the_wandb_run_still_ends_failed(tmp_path, offline_wandb):
    exp = str(tmp_path / "exp")
    mon = Monitor(_wandb_cfg(), exp)
    mon.log(1000, 1.0, {"train/fps": 1.0})

    def no_space():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    mon._tb.flush = no_space  # as TensorBoard's writer thread reports a write the disk refused
    with pytest.raises(DiskFullError, match="TensorBoard's event file could not be written, as the disk holding"):
        mon.log(2000, 2.0, {"train/fps": 2.0})
    mon.log(3000, 3.0, {"train/fps": 3.0})  # the shutdown's last report: W&B only, no second error
    mon.close(exit_code=1)
    run = _read_offline_run(offline_wandb, open(os.path.join(exp, WANDB_ID_FILE)).read().strip())
    assert [row["env_frames"] for row in run["history"]] == [1000, 2000, 3000]
    assert run["exit_code"] == 1
