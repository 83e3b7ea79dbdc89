"""--device auto where a GPU is present: the run is planned on the GPU and on the CPU and
trains where the plan predicts more. The choice's logic with the profile replaced by set
predictions (no GPU needed); the plan file's device; and, on a GPU machine, a real run."""
import dataclasses
import json
import os
import re
import types

import pytest
from helpers import GPU_MARKS, TrainRun, read_summary

from fastrl.algo.model import Precision
from fastrl.config import Config
from fastrl.plumbing.ranks import SOLO, Rank
from fastrl.runtime import runner
from fastrl.tuning.planner import Plan

FP32 = Precision("fp32", "fp32", "no image encoder")


def plan_predicting(steps_per_s: float) -> Plan:
    return Plan(num_workers=2, num_envs_per_worker=8, inference="local", num_policy_workers=1, learner_threads=1,
                num_buffers=4, predicted={"trained_steps_per_s": steps_per_s})


@pytest.fixture
def planned_on(monkeypatch):
    """A GPU 'present', and each device's plan predicting the rate set in the dict returned;
    the devices planned on are recorded under "asked"."""
    rates = {"asked": []}

    def make_plan(cfg, explicit, env, resuming, precision, one_thread=None, announce=True):
        rates["asked"].append(cfg.device)
        return plan_predicting(rates[cfg.device])

    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "decide_precision", lambda cfg, obs_space, action_space: (FP32, None))
    monkeypatch.setattr(runner, "make_plan", make_plan)
    return rates


def place(cfg, explicit=frozenset(), resuming=False, rank=SOLO):
    spaces = types.SimpleNamespace(observation_space=None, action_space=None)  # what the fakes are shown
    return runner.place_run(cfg, set(explicit), spaces, frameskip=1, resuming=resuming, rank=rank)


@pytest.mark.parametrize("cuda, cpu, chosen", [(1000.0, 3000.0, "cpu"), (3000.0, 1000.0, "cuda"),
                                               (2000.0, 2000.0, "cuda")])
def test_auto_trains_where_the_plan_predicts_more(planned_on, capsys, cuda, cpu, chosen):
    planned_on.update(cuda=cuda, cpu=cpu)
    placement = place(Config(env="CartPole-v1"))
    assert planned_on["asked"] == ["cuda", "cpu"]
    assert placement.plan.device == chosen
    assert placement.plan.predicted["trained_steps_per_s"] == planned_on[chosen]
    assert runner.planner.apply(Config(env="CartPole-v1"), placement.plan).device == chosen
    out = capsys.readouterr().out
    assert f"planned {cuda:,.0f} env frames/s trained on the GPU, {cpu:,.0f} on the CPU" in out, out
    assert f"training on the {'GPU' if chosen == 'cuda' else 'CPU'}" in out, out


def test_auto_written_out_compares_as_the_default_does(planned_on):
    planned_on.update(cuda=1000.0, cpu=3000.0)
    placement = place(Config(env="CartPole-v1", device="auto"), explicit={"device"})
    assert planned_on["asked"] == ["cuda", "cpu"]
    assert placement.plan.device == "cpu"


@pytest.mark.parametrize("case", ["device cuda", "plan off", "torchrun", "saved plan"])
def test_the_plan_does_not_choose_where_the_device_is_not_its_to_choose(planned_on, tmp_path, case):
    planned_on.update(cuda=1000.0, cpu=3000.0, auto=1000.0)
    cfg = Config(env="CartPole-v1", train_dir=str(tmp_path))
    explicit, resuming, rank = set(), False, SOLO
    if case == "device cuda":
        cfg, explicit = dataclasses.replace(cfg, device="cuda"), {"device"}
    elif case == "plan off":
        cfg = dataclasses.replace(cfg, plan="off")
    elif case == "torchrun":
        rank = Rank(rank=0, world_size=2, local_rank=0, local_world_size=2)
    else:
        os.makedirs(cfg.experiment_dir)
        with open(os.path.join(cfg.experiment_dir, "plan.json"), "w") as fh:
            fh.write(plan_predicting(1.0).to_json())
        resuming = True
    placement = place(cfg, explicit, resuming, rank)
    assert planned_on["asked"] == [cfg.device]
    assert placement.plan.device == "auto"  # the plan leaves --device as it was
    assert runner.planner.apply(cfg, placement.plan).device == cfg.device


def test_without_a_gpu_auto_plans_once(monkeypatch):
    monkeypatch.setattr(runner.torch.cuda, "is_available", lambda: False)
    assert not runner.compares_devices(Config(env="CartPole-v1"), resuming=False, rank=SOLO)


def test_the_plan_file_keeps_the_device_and_older_plans_read_as_auto():
    plan = dataclasses.replace(plan_predicting(5.0), device="cpu")
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.options()["device"] == "cpu"
    older = json.loads(plan.to_json())
    del older["device"]
    assert Plan.from_json(json.dumps(older)).device == "auto"
    assert "device" not in Plan.from_json(json.dumps(older)).options()
    with pytest.raises(ValueError, match="its device is 'tpu', not one of auto, cpu, cuda"):
        Plan.from_json(json.dumps({**older, "device": "tpu"}))


@GPU_MARKS[0]
@GPU_MARKS[1]
def test_auto_on_a_gpu_machine_trains_where_it_says(tmp_path):
    run = TrainRun(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--train_for_seconds", "25",
                    "--status_every_seconds", "5"])
    assert run.wait(timeout=120) == 0, run.output()
    out = run.output()
    said = re.search(r"--device auto: planned ([\d,]+) env frames/s trained on the GPU, ([\d,]+) on the CPU; "
                     r"training on the (GPU|CPU)", out)
    assert said, out
    gpu, cpu = (float(said.group(k).replace(",", "")) for k in (1, 2))
    device = "cuda" if said.group(3) == "GPU" else "cpu"
    assert device == ("cuda" if gpu >= cpu else "cpu"), out
    folder = tmp_path / "CartPole-v1"
    assert json.loads((folder / "plan.json").read_text())["device"] == device
    assert f"inference local on {device}" in out or f"inference policy_worker on {device}" in out, out
    assert read_summary(tmp_path, "CartPole-v1")["mean_return_100"] > 100, out
