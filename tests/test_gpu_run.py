"""The main job on a GPU, run as a user runs it: the learner and a policy worker on
CUDA, the policy worker acting through CUDA graphs with the learner's weights
handed over by CUDA IPC. Skipped, with the reason, where torch sees no GPU."""
import json
import os

from helpers import GPU_MARKS, TrainRun, read_summary
from test_doom_train import random_policy_mean_return

pytestmark = list(GPU_MARKS)


def test_doom_basic_learns_in_60_s_on_the_gpu(tmp_path):
    baseline = random_policy_mean_return("doom_basic", episodes=30)
    # Rollout workers on all but two cores (the learner's and the policy worker's
    # host sides), 16 envs each: what a GPU machine runs; the planner's choice is not
    # what this tests.
    workers = max(1, min(8, (os.cpu_count() or 4) - 2))
    run = TrainRun(["--env", "doom_basic", "--train_dir", str(tmp_path), "--device", "cuda", "--plan", "off",
                    "--num_workers", str(workers), "--num_envs_per_worker", "16", "--inference", "policy_worker",
                    "--train_for_seconds", "60", "--stop_at_reward", str(baseline + 120),
                    "--status_every_seconds", "10"])
    assert run.wait(timeout=150) == 0, run.output()
    out = run.output()
    assert "inference policy_worker on cuda" in out, out
    assert "running eagerly" not in out, out  # the policy worker's CUDA graphs were captured
    summary = read_summary(tmp_path, "doom_basic")
    assert summary["mean_return_100"] > baseline + 30, (baseline, summary, out)
    assert run.leftover_processes() == []
    assert run.new_shm_entries() == set()


def test_the_bench_reports_the_gpus_share_and_copies(tmp_path):
    out = tmp_path / "bench.json"
    run = TrainRun(["--env", "doom_basic", "--train_dir", str(tmp_path), "--device", "cuda", "--plan", "off",
                    "--num_workers", "4", "--num_envs_per_worker", "16", "--inference", "policy_worker",
                    "--mode", "train", "--seconds", "10", "--warmup", "10", "--json", str(out)], module="fastrl.bench")
    assert run.wait(timeout=150) == 0, run.output()
    gpu = json.loads(out.read_text())["results"]["train"]["gpu"]
    assert 0 < gpu["busy"] <= 1 and gpu["shares"]["learner"] > 0 and gpu["shares"]["policy"] > 0, gpu
    assert gpu["h2d_s_per_batch"] > 0 and gpu["d2h_s_per_forward"] > 0, gpu
    assert "GPU: busy" in run.output() and "GPU copies: upload" in run.output()
