"""Population-based training's bookkeeping (fastrl/learning/pbt.py), its hand-over
to the learners through shared memory (fastrl/plumbing/hyper.py), and a learner
taking what it was handed."""
import math
import types

import gymnasium as gym
import pytest
import torch

from fastrl.algo.model import Precision, build_model, flat_state
from fastrl.config import Config
from fastrl.learning import pbt
from fastrl.learning.learner import Learner, LearnerStart
from fastrl.plumbing.hyper import SharedHyper
from fastrl.plumbing.params import SharedParams
from fastrl.plumbing.stats_board import StatsBoard

BASE = {"lr": 1e-3, "entropy_coef": 0.003, "gamma": 0.99, "reward_scale": 1.0}


def population(n=4, fraction=0.25, factor=1.2, seed=0):
    return pbt.Population(BASE, n, fraction, factor, seed)


def one_step_away(value, name, source_value, factor):
    """Whether `value` is `source_value` moved one step of `factor` (or held at a bound)."""
    candidates = {pbt.perturb(source_value, name, factor, up) for up in (True, False)}
    return any(math.isclose(value, c, rel_tol=1e-12) for c in candidates)


def test_perturb_moves_by_the_factor_and_gamma_by_its_horizon_within_bounds():
    assert pbt.perturb(1e-3, "lr", 1.2, up=True) == pytest.approx(1.2e-3)
    assert pbt.perturb(1e-3, "lr", 1.2, up=False) == pytest.approx(1e-3 / 1.2)
    # gamma 0.99 is a horizon of 100 steps; one step up is 120: gamma 1 - 1/120.
    assert pbt.perturb(0.99, "gamma", 1.2, up=True) == pytest.approx(1 - 1 / 120)
    assert pbt.perturb(0.99, "gamma", 1.2, up=False) == pytest.approx(1 - 1.2 / 100)
    assert pbt.perturb(0.9999, "gamma", 2.0, up=True) == pbt.BOUNDS["gamma"][1]
    assert pbt.perturb(1e-2, "lr", 2.0, up=True) == pbt.BOUNDS["lr"][1]
    assert pbt.perturb(0.0, "entropy_coef", 2.0, up=True) == 0.0  # off stays off


def test_the_worst_policy_takes_the_best_ones_hyperparameters_perturbed_within_bounds():
    pop = population()
    pop.hyper[2] = {"lr": 5e-4, "entropy_coef": 0.01, "gamma": 0.995, "reward_scale": 0.5}  # the best's own
    events = pop.round(1, [3.0, 1.0, 9.0, 5.0], env_steps=1000)  # policy 1 worst, policy 2 best
    assert len(events) == 1  # a quarter of 4 policies
    e = events[0]
    assert (e["policy"], e["copied_from"], e["objective"], e["source_objective"]) == (1, 2, 1.0, 9.0)
    assert e["round"] == 1 and e["env_steps"] == 1000
    for name, value in e["hyper"].items():
        low, high = pbt.BOUNDS[name]
        assert low <= value <= high
        assert one_step_away(value, name, pop.hyper[2][name], 1.2), name
        assert value != pop.hyper[2][name], f"{name} was not perturbed"
    assert pop.hyper[1] == e["hyper"]
    assert pop.hyper[0] == BASE and pop.hyper[3] == BASE  # the others keep theirs


def test_no_round_while_a_policy_has_no_objective_and_no_copy_between_equals():
    pop = population()
    assert not pop.ready([1.0, None, 2.0, 3.0]) and not pop.ready([1.0, float("nan"), 2.0, 3.0])
    with pytest.raises(ValueError):
        pop.round(1, [1.0, None, 2.0, 3.0], 10)
    assert pop.round(1, [500.0] * 4, 10) == []  # all level (CartPole's ceiling): nothing to learn from
    assert pop.rounds == 1


def test_start_perturbs_every_policy_but_the_first():
    pop = population()
    events = pop.start()
    assert [e["policy"] for e in events] == [1, 2, 3] and all(e["copied_from"] is None for e in events)
    assert pop.hyper[0] == BASE
    for e in events:
        assert all(one_step_away(e["hyper"][k], k, BASE[k], 1.2) for k in BASE)


def test_a_population_replayed_from_its_log_goes_on_as_the_uninterrupted_one(tmp_path):
    path = str(tmp_path / pbt.LOG_NAME)
    objectives = [[1.0, 4.0, 2.0, 8.0], [6.0, 2.0, 7.0, 1.0], [3.0, 3.5, 0.5, 9.0]]
    whole = population(seed=7)
    pbt.append_log(path, whole.start())
    for r, obj in enumerate(objectives[:2], start=1):
        pbt.append_log(path, whole.round(r, obj, 1000 * r))
    resumed = population(seed=7)
    resumed.replay(pbt.read_log(path))
    assert resumed.hyper == whole.hyper and resumed.rounds == whole.rounds == 2
    # Round 4 (round 3 changed nothing, say) draws the same sources and perturbations in both.
    assert resumed.round(4, objectives[2], 4000) == whole.round(4, objectives[2], 4000)


def test_the_log_leaves_out_a_line_cut_short_and_refuses_a_damaged_one(tmp_path):
    path = str(tmp_path / pbt.LOG_NAME)
    events = population().start()
    pbt.append_log(path, events[:2])
    with open(path, "a") as fh:
        fh.write('{"round": 0, "pol')  # a crash while the third was written
    assert pbt.read_log(path) == events[:2]
    pbt.append_log(path, events[2:])  # the cut line is dropped, not glued to
    assert pbt.read_log(path) == events
    with open(path, "w") as fh:
        fh.write("not json\n" + '{"round": 0}\n')
    with pytest.raises(ValueError, match="line 1 is not a PBT event"):
        pbt.read_log(path)
    assert pbt.read_log(str(tmp_path / "none.jsonl")) == []
    with pytest.raises(ValueError, match="policy 4"):
        population().replay([{**events[0], "policy": 4}])


def test_shared_hyper_hands_each_change_over_once():
    hyper = SharedHyper(3, pbt.HYPERPARAMETERS)
    assert hyper.take(1, 0) is None
    hyper.set(1, {**BASE, "lr": 2e-3}, copy_from=2)
    epoch, values, source = hyper.take(1, 0)
    assert values == {**BASE, "lr": 2e-3} and source == 2
    assert hyper.take(1, epoch) is None and hyper.take(0, 0) is None
    hyper.set(1, BASE)
    epoch2, values, source = hyper.take(1, epoch)
    assert epoch2 != epoch and values == BASE and source is None


def test_a_learner_takes_the_best_policys_weights_and_its_new_hyperparameters():
    cfg = Config(env="CartPole-v1", num_policies=2, with_pbt=True)
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    models = [build_model(cfg, env.observation_space, env.action_space) for _ in range(2)]
    params = [SharedParams(flat_state(m).numel()) for m in models]
    for p, m in zip(params, models):
        p.publish(flat_state(m), 5)
    hyper = SharedHyper(2, pbt.HYPERPARAMETERS)
    ctx = types.SimpleNamespace(obs_space=env.observation_space, action_space=env.action_space, params=params,
                                board=StatsBoard(["learner", "learner_1"]), hyper=hyper,
                                precision=Precision("fp32", "fp32", "no image encoder"))
    learner = Learner(cfg, ctx, "cpu", LearnerStart(policy=1))
    for p in learner.model.parameters():
        p.grad = torch.zeros_like(p)
    learner.optimizer.step()  # moments of the old weights, which the new ones must not inherit
    assert learner.optimizer.state
    assert not torch.equal(flat_state(learner.model), params[0].flat)
    new = {"lr": 4e-4, "entropy_coef": 0.02, "gamma": 0.95, "reward_scale": 2.0}
    hyper.set(1, new, copy_from=0)
    learner._take_hyper()
    assert torch.equal(flat_state(learner.model), params[0].flat)  # policy 0's weights
    assert learner.optimizer.param_groups[0]["lr"] == 4e-4 and not learner.optimizer.state
    assert (learner.cfg.entropy_coef, learner.cfg.gamma, learner.cfg.reward_scale) == (0.02, 0.95, 2.0)
    before = flat_state(learner.model)
    learner._take_hyper()  # nothing new: nothing changes
    assert torch.equal(flat_state(learner.model), before)
    env.close()
