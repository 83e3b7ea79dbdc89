"""A rollout worker's compiled forward (fastrl/sampling/compiled_act.py): the
compiled act against eager, through weight reloads, and the choice `auto` makes
from timed forwards (on a fake clock), failures included, and a real run's report."""
from __future__ import annotations

import queue
import signal
import types

import pytest
import torch
from helpers import TrainRun, read_summary
from test_compiled import IMAGE, slow_compile, small_image_model

from fastrl.algo.model import flat_state, load_flat_state
from fastrl.sampling import compiled_act as compiled_act_module
from fastrl.sampling.compiled_act import (
    ACT_COMPILE_KEY,
    START_AFTER_S,
    TIMED_FORWARDS,
    CompiledAct,
    actors_compile,
    describe_actor_compiles,
)
from fastrl.sampling.inference import LocalPolicy


def small_image_actor():
    """test_compiled's small image-and-GRU model (the same weights every call), acting."""
    return small_image_model()[1].eval()


def test_the_compiled_forward_gives_eager_outputs_through_new_weights():
    eager, compiled = small_image_actor(), small_image_actor()
    act = torch.compile(compiled.act)
    gen = torch.Generator().manual_seed(1)
    obs = {"obs": torch.randint(0, 256, (8, *IMAGE.shape), dtype=torch.uint8, generator=gen)
           .contiguous(memory_format=torch.channels_last)}
    rnn = torch.randn(8, eager.rnn_state_size, generator=gen)
    first = flat_state(eager)
    newer = first + 0.05 * torch.randn(first.shape, generator=gen)
    for reload in (False, True):  # an actor's weights change in place (load_flat_state) as the learner publishes
        if reload:
            load_flat_state(eager, newer)
            load_flat_state(compiled, newer)
        with torch.no_grad():
            want, got = eager.act(obs, rnn, deterministic=True), act(obs, rnn, deterministic=True)
        torch.testing.assert_close(got.actions, want.actions)
        for name in ("logp", "values", "rnn_state"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5, msg=name)
    assert not torch.equal(first, newer)  # the reload did change the weights


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StubActor(torch.nn.Module):
    """An actor whose eager forward takes `cost["eager"]` seconds on the fake clock."""

    def __init__(self, clock: FakeClock, cost: dict):
        super().__init__()
        self.clock, self.cost = clock, cost
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def act(self, obs, rnn_state, deterministic=False):
        self.clock.now += self.cost["eager"]
        return "eager"


@pytest.fixture
def fake_compile(monkeypatch, tmp_path):
    """torch.compile giving a forward of cost["compiled"] seconds (or raising when
    that is an exception; its first call is the compile)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # what the compile points inductor at
    clock, cost = FakeClock(), {"eager": 1.0, "compiled": 0.5}

    def compiled(fn):
        def call(*args, **kwargs):
            if isinstance(cost["compiled"], Exception):
                raise cost["compiled"]
            clock.now += cost["compiled"]
            return "compiled"
        return call

    monkeypatch.setattr(compiled_act_module.torch, "compile", compiled)
    return clock, cost


def drive(chooser: CompiledAct, calls: int) -> list:
    """`calls` forwards through the model's act, as LocalPolicy makes them: the outputs."""
    return [chooser.model.act({}, torch.zeros(1)) for _ in range(calls)]


@pytest.mark.parametrize("compiled_s, chosen", [(0.5, "compiled"), (0.98, "eager"), (1.1, "eager")])
def test_auto_acts_eagerly_first_then_keeps_whichever_timed_faster(fake_compile, compiled_s, chosen):
    clock, cost = fake_compile
    cost["compiled"] = compiled_s
    model = StubActor(clock, cost)
    chooser = CompiledAct(model, "auto", clock=clock)
    assert model.act is chooser  # installed on the instance: LocalPolicy's forwards go through it
    before = int(START_AFTER_S / cost["eager"])
    assert set(drive(chooser, before)) == {"eager"} and chooser.state == "waiting"
    outputs = drive(chooser, before + 3 * TIMED_FORWARDS)
    report = chooser.take_report()
    assert report["chosen"] == chosen and chooser.state == chosen
    assert report["eager_forward_s"] == pytest.approx(1.0) and report["compiled_forward_s"] == pytest.approx(compiled_s)
    assert len(chooser._times["eager"]) == len(chooser._times["compiled"]) == TIMED_FORWARDS
    assert outputs[-1] == chosen
    assert chooser.take_report() is None  # handed over once


def test_on_compiles_at_once_and_keeps_it_untimed(fake_compile):
    clock, cost = fake_compile
    chooser = CompiledAct(StubActor(clock, cost), "on", clock=clock)
    assert drive(chooser, 3) == ["compiled"] * 3  # compiled on the first call
    report = chooser.take_report()
    assert report["chosen"] == "compiled" and report["ratio"] is None
    assert "--compile_actors on" in report["why"]


def test_a_failed_compile_leaves_the_forward_eager(fake_compile):
    clock, cost = fake_compile
    cost["compiled"] = RuntimeError("CppCompileError: no C++ compiler")
    chooser = CompiledAct(StubActor(clock, cost), "on", clock=clock)
    assert drive(chooser, 5) == ["eager"] * 5  # the failed compile's call answered eagerly too
    report = chooser.take_report()
    assert report["chosen"] == "eager" and report["why"].startswith("compiling failed (RuntimeError: CppCompileError")


def test_the_compile_keeps_the_worker_beating(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    beats = []
    monkeypatch.setattr(compiled_act_module.torch, "compile", slow_compile)
    clock, cost = FakeClock(), {"eager": 0.0}
    chooser = CompiledAct(StubActor(clock, cost), "on", beat=lambda: beats.append(1))
    assert drive(chooser, 1) == ["eager"]  # the stub's own act, through the fake compile
    assert len(beats) == 2 and chooser.take_report()["compile_s"] >= 0


def test_a_compiled_forward_that_raises_later_is_answered_eagerly_and_the_worker_stays_eager(fake_compile):
    clock, cost = fake_compile
    chooser = CompiledAct(StubActor(clock, cost), "auto", clock=clock)
    drive(chooser, int(START_AFTER_S) + 1)  # compiled, now timing
    assert chooser.state == "timing"
    cost["compiled"] = RuntimeError("a guard inductor cannot check")
    assert drive(chooser, 4) == ["eager"] * 4
    report = chooser.take_report()
    assert report["chosen"] == "eager" and report["why"].startswith("the worker's compiled forward failed")


@pytest.mark.parametrize("mode, images, rnn, device, inference, precision, expected", [
    ("auto", True, True, "cpu", "local", "fp32", True),
    ("auto", True, True, "cpu", "local", "bf16", False),  # bf16's weight copies refresh in Python
    ("auto", False, True, "cpu", "local", "fp32", False),  # a vector model: the learner does not compile it either
    ("auto", True, True, "cpu", "policy_worker", "fp32", False),  # batches of changing size
    ("on", False, False, "cpu", "local", "bf16", True),
    ("on", True, True, "cuda", "local", "fp32", False),  # CUDA graphs already
    ("off", True, True, "cpu", "local", "fp32", False),
])
def test_which_workers_compile(mode, images, rnn, device, inference, precision, expected):
    assert actors_compile(mode, images, rnn, device, inference, precision) is expected


def test_the_run_line_names_how_many_workers_compiled_and_the_medians():
    reports = [{"chosen": "compiled", "why": "faster", "eager_forward_s": 0.010, "compiled_forward_s": 0.008,
                "ratio": 0.8},
               {"chosen": "eager", "why": "not faster than eager (needs under 0.95x)", "eager_forward_s": 0.010,
                "compiled_forward_s": 0.0098, "ratio": 0.98}]
    line = describe_actor_compiles(reports)
    assert line.startswith("the rollout workers' forward runs compiled in 1 of 2: 8.9 ms a forward against eager's "
                           "10.0 (0.89x, medians)")
    assert "faster" in line and "needs under 0.95x" in line
    failed = [{"chosen": "eager", "why": "compiling failed (x)", "eager_forward_s": None, "compiled_forward_s": None,
               "ratio": None}]
    assert describe_actor_compiles(failed) == "the rollout workers' forward stays eager in all 1; compiling failed (x)"


def test_a_run_with_compile_actors_on_reports_every_workers_compiled_forward(tmp_path):
    # The real entry point: each worker compiles its forward at its first, and the
    # run's line and summary.json say so; a vector model's forward keeps the compile
    # short. Stopped once the line shows.
    run = TrainRun(["--env", "CartPole-v1", "--num_workers", "2", "--plan", "off", "--compile_actors", "on",
                    "--compile_learner", "off", "--train_for_seconds", "240", "--stop_at_reward", "1e9",
                    "--train_dir", str(tmp_path), "--status_every_seconds", "10"])
    try:
        run.wait_for_line(lambda line: line.startswith("fastrl: the rollout workers' forward"), timeout=200)
        run.signal_group(signal.SIGINT)
        assert run.wait(timeout=60) == 128 + signal.SIGINT, run.output()
    finally:
        run.kill_all()
    assert "fastrl: the rollout workers' forward runs compiled in 2 of 2; asked for (--compile_actors on)" \
        in run.lines, run.output()
    reports = read_summary(tmp_path, "CartPole-v1")["actor_compile"]
    assert [(r["worker"], r["chosen"]) for r in reports] == [(0, "compiled"), (1, "compiled")]
    assert all(r["compile_s"] > 0 for r in reports)
    assert run.leftover_processes() == []


def test_a_full_metrics_queue_keeps_the_report_for_a_later_forward():
    # Acting never waits on the runner: a report the queue has no room for is sent
    # with the next forward instead.
    class FullOnce:
        def __init__(self):
            self.tries, self.taken = 0, []

        def put_many(self, messages, block):
            self.tries += 1
            if self.tries == 1:
                raise queue.Full
            self.taken += messages

    metrics = FullOnce()
    reports = iter([{"chosen": "compiled"}, None, None])
    policy = types.SimpleNamespace(ctx=types.SimpleNamespace(metrics_queue=metrics), worker=1, policy=0,
                                   compiled=types.SimpleNamespace(take_report=lambda: next(reports)), _report=None)
    LocalPolicy._send_compile_report(policy)
    assert metrics.taken == [] and policy._report == {"chosen": "compiled"}
    LocalPolicy._send_compile_report(policy)
    assert metrics.taken == [{ACT_COMPILE_KEY: {"chosen": "compiled", "worker": 1, "policy": 0}}]
    LocalPolicy._send_compile_report(policy)
    assert metrics.tries == 2  # nothing more to send
