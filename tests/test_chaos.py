"""benchmarks/chaos.py, short: a CartPole run whose workers are killed and frozen
at random for 45 s heals from every fault, and stops leaving nothing behind."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_cartpole_run_heals_from_45_s_of_chaos(tmp_path):
    report_path = tmp_path / "chaos.json"
    # A 5-s hang timeout: the supervisor must tell a frozen worker from a busy one
    # on a loaded machine, and each frozen worker costs the chaos that long.
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "chaos.py"), "--env", "CartPole-v1",
                           "--minutes", "0.75", "--mean_interval_s", "1", "--hang_timeout_s", "5", "--calm_s", "5",
                           "--seed", "0", "--train_dir", str(tmp_path / "runs"), "--json", str(report_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    kinds = [f["kind"] for f in report["faults"]]
    assert {"rollout", "policy", "hang"} <= set(kinds), kinds  # every kind a CartPole run has was tried
    assert all(f["recovered_s"] is not None for f in report["faults"]), report["faults"]
    checks = report["checks"]
    assert all(c["ok"] for c in checks.values()), checks
    assert checks["hangs"]["text"] == "0"
    assert checks["leftovers"]["text"] == "0 processes, 0 new /dev/shm entries"
    assert checks["stop"]["text"].startswith("SIGINT: exit code 130")
