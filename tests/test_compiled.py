"""The learner's compiled step (fastrl/learning/compiled.py): the compiled re-run
of the policy gives eager's outputs and gradients, and the switch keeps whichever
the timed steps say is faster, staying eager on any failure."""
import copy
import functools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import psutil
import pytest
import torch
from helpers import REPO, TrainRun, read_summary
from test_gradient_step import OBS, _batch, _on_policy
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from fastrl.algo.model import ActorCritic, ModelSpec, build_model
from fastrl.config import Config, parse_args
from fastrl.learning import compiled as compiled_module
from fastrl.learning.compiled import COMPILE_STARTED_LINES, TIMED_STEPS, CompiledEvaluate, describe_compile
from fastrl.learning.learner import _time_limits, gradient_step, trajectory_loss
from fastrl.plumbing.compiling import BEAT_EVERY_S, cache_holds, cache_mark, set_cache_mark
from fastrl.tuning.profiling import _fake_minibatch

IMAGE = gym.spaces.Box(0, 255, (3, 36, 48), dtype="uint8")
ACTIONS = gym.spaces.MultiDiscrete([3, 2])


def small_image_model(precision="fp32"):
    cfg, _ = parse_args(["--env", "doom_basic", "--use_rnn", "true", "--rnn_size", "32", "--rollout", "4",
                         "--batch_size", "16"])
    torch.manual_seed(0)
    model = build_model(cfg, IMAGE, ACTIONS, precision)
    return cfg, model, _fake_minibatch(cfg, model, IMAGE, torch.Generator().manual_seed(0))


def test_the_compiled_step_gives_eager_outputs_and_gradients():
    cfg, eager, mb = small_image_model()
    compiled = build_model(cfg, IMAGE, ACTIONS, "fp32")
    compiled.load_state_dict(eager.state_dict())
    compiled.evaluate = torch.compile(compiled.evaluate)
    outs = []
    for model in (eager, compiled):
        out, _ = gradient_step(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), mb, mb["valid"])
        outs.append(out)
    torch.testing.assert_close(outs[1].total, outs[0].total, rtol=1e-5, atol=1e-6)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        assert p_eager.grad is not None, name
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow  # a cold compile: ~25 s on 2 cores
def test_the_whole_loss_compiled_gives_eager_outputs_where_time_limits_cut_episodes():
    # gradient_step's `loss` compiled whole: the loss on trajectories, with the time
    # limits' data-dependent indexing left eager between its two graphs.
    # test_gradient_step's batch: an episode end of each kind, two steps cut by a time limit.
    cfg = Config(env="CartPole-v1")
    torch.manual_seed(0)
    eager = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    compiled = copy.deepcopy(eager)
    mb = _on_policy(eager, _batch())
    valid = torch.ones_like(mb["rewards"])
    loss = torch.compile(functools.partial(trajectory_loss, time_limits=torch.compiler.disable(_time_limits)))
    outs = [gradient_step(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), mb, valid, loss=how)[0]
            for model, how in ((eager, None), (compiled, loss))]
    torch.testing.assert_close(outs[1].total, outs[0].total, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[1].vs_tm1, outs[0].vs_tm1, rtol=1e-5, atol=1e-6)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-6, msg=name)
    # The cut episodes' bootstrap values reached the targets: without the cuts they differ.
    uncut = dict(mb, truncated=torch.zeros_like(mb["truncated"]))
    assert not torch.allclose(trajectory_loss(cfg, eager, uncut, valid).vs_tm1, outs[0].vs_tm1)


def drive(chooser, mb, step_seconds, steps=4 * TIMED_STEPS + 8):
    """The learner's calls around each gradient step, the step taking
    step_seconds[which is in use] (a number, or a list taken in turn); waits for the
    background compile between."""
    taken = {"eager": 0, "compiled": 0}
    for _ in range(steps):
        chooser.before_step(mb)
        if chooser.state == "warming" and chooser._warm is not None:
            chooser._warm.join(timeout=60)
        which = chooser._current
        seconds = step_seconds[which]
        if isinstance(seconds, list):
            seconds = seconds[min(taken[which], len(seconds) - 1)]
        taken[which] += 1
        chooser.after_step(seconds)
    return chooser.take_report()


@pytest.fixture
def no_real_compile(monkeypatch):
    """torch.compile as the identity and no compiling process: the choice is what
    these tests look at."""
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn: fn)
    monkeypatch.setattr(compiled_module, "compile_in_child", lambda *args: None)


@pytest.mark.parametrize("compiled_s, chosen", [(0.5, "compiled"), (0.98, "eager"), (1.1, "eager")])
def test_auto_keeps_whichever_timed_faster(no_real_compile, compiled_s, chosen):
    cfg, model, mb = small_image_model()
    chooser = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True)
    report = drive(chooser, mb, {"eager": 1.0, "compiled": compiled_s})
    assert report["chosen"] == chosen and chooser.state == chosen
    assert report["eager_step_s"] == 1.0 and report["compiled_step_s"] == compiled_s
    assert ("evaluate" in model.__dict__) == (chosen == "compiled")  # the instance's own, or the class's
    assert chooser.take_report() is None  # handed over once
    assert describe_compile(report).startswith("the learner's step runs compiled" if chosen == "compiled"
                                               else "the learner's step stays eager")


def test_a_close_call_is_timed_for_twice_the_steps_before_the_choice(no_real_compile):
    # The first TIMED_STEPS compiled steps at 0.96x, then 0.85x: the first five alone
    # would keep eager; all ten a side (median 0.905x) choose compiled.
    _, model, mb = small_image_model()
    chooser = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True)
    compiled_s = [0.96] * (TIMED_STEPS + 1) + [0.85] * TIMED_STEPS  # the first compiled call is not timed
    report = drive(chooser, mb, {"eager": 1.0, "compiled": compiled_s})
    assert report["chosen"] == "compiled" and report["compiled_step_s"] == pytest.approx(0.905)
    assert len(chooser._times["compiled"]) == len(chooser._times["eager"]) == 2 * TIMED_STEPS
    # Clear either way after TIMED_STEPS a side: no more timing.
    _, model, mb = small_image_model()
    clear = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True)
    assert drive(clear, mb, {"eager": 1.0, "compiled": 0.8})["chosen"] == "compiled"
    assert len(clear._times["compiled"]) == TIMED_STEPS


@pytest.mark.parametrize("prior, compiled_s, chosen, judged", [
    # One noisy timing (1.03x) against four earlier runs at 0.80-0.90x: compiled, on their median.
    ([0.85, 0.88, 0.80, 0.90], 1.03, "compiled", 0.88),
    # Only the last PRIOR_RUNS count: the two oldest (slower) ones are forgotten.
    ([1.2, 1.2, 0.85, 0.88, 0.80, 0.90], 1.03, "compiled", 0.88),
    # Earlier runs that kept eager hold against one fast timing.
    ([1.05, 1.10], 0.80, "eager", 1.05),
    # A step that truly turned slower is judged so once most of the runs say it.
    ([0.85, 0.88, 1.10, 1.12], 1.05, "eager", 1.05),
])
def test_auto_judges_its_timing_with_what_earlier_runs_measured(no_real_compile, prior, compiled_s, chosen, judged):
    assert compiled_module.PRIOR_RUNS == 4
    _, model, mb = small_image_model()
    chooser = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True, prior=prior)
    report = drive(chooser, mb, {"eager": 1.0, "compiled": compiled_s})
    assert report["chosen"] == chosen and report["ratio"] == pytest.approx(compiled_s)
    runs = min(len(prior), compiled_module.PRIOR_RUNS)
    assert report["judged_ratio"] == pytest.approx(judged) and report["prior_runs"] == runs
    assert f"judged {judged:.2f}x, the median with the {runs} earlier runs of this setup on this machine" \
        in describe_compile(report)


def test_with_no_earlier_run_auto_judges_on_its_own_timing(no_real_compile):
    _, model, mb = small_image_model()
    report = drive(CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True), mb,
                   {"eager": 1.0, "compiled": 1.03})
    assert report["chosen"] == "eager" and report["judged_ratio"] == pytest.approx(1.03)
    assert report["prior_runs"] == 0 and "judged" not in describe_compile(report)


def test_the_background_compile_starts_after_the_first_step_not_beside_it(no_real_compile):
    # Dynamo's tracing holds the GIL: started beside the first step, it made that
    # step, and the first update the actors get, seconds late.
    _, model, mb = small_image_model()
    chooser = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True)
    chooser.before_step(mb)
    assert chooser._warm is None and not chooser.take_started()
    taken, given = chooser._inputs["obs"]["obs"], mb["obs"]["obs"]
    assert torch.equal(taken, given) and taken.data_ptr() != given.data_ptr()  # a copy: the batch may go
    chooser.after_step(1.0)
    assert chooser.state == "warming"
    assert chooser.take_started() == "background" and not chooser.take_started()  # said once, for the run's notice
    chooser._warm.join(timeout=60)
    assert chooser._warm_error is None
    assert chooser._inputs is None  # handed to the compile, not kept


def test_the_compile_runs_on_the_learners_thread_count(monkeypatch):
    # Inductor's cache keys on the thread count: compiled on another, the learner's
    # own compile would find nothing and start cold.
    asked = []
    monkeypatch.setattr(compiled_module, "compile_in_child", lambda replica, inputs, uniform_kl, threads:
                        asked.append(threads))
    _, model, mb = small_image_model()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        chooser = CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False)
        chooser.before_step(mb)
        chooser.after_step(1.0)
        chooser._warm.join(timeout=60)
    finally:
        torch.set_num_threads(threads)
    assert asked == [3]


def tiny_vector_learner():
    """CartPole's smallest model, its batch and an optimizer that changes nothing:
    a cold compile of it takes seconds."""
    torch.manual_seed(0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    mb = _on_policy(model, _batch())
    return model, mb, torch.optim.SGD(model.parameters(), lr=0.0)


def test_eager_steps_beside_the_background_compile_run_untouched_and_the_cache_fills(monkeypatch, tmp_path):
    # FX's tracing swaps nn.Module.__call__ for the whole process while it traces:
    # with the compile in a thread of the learner, an eager step beside it went into
    # the tracer (NameError: module is not installed as a submodule), which killed a
    # CI run's learner; so the compile runs in a process of its own. A step's module
    # calls hit a trace's few milliseconds about half the time; with 200-ms bursts of
    # calls to a small module between steps, 6 of 6 runs of the thread failed.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = Config(env="CartPole-v1")
    model, mb, optimizer = tiny_vector_learner()
    valid = torch.ones_like(mb["rewards"])
    other, x = torch.nn.Linear(4, 4), torch.zeros(1, 4)
    chooser = CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False)
    steps_beside = 0
    while chooser.state not in ("compiled", "eager"):
        chooser.before_step(mb)
        start = time.perf_counter()
        gradient_step(cfg, model, optimizer, mb, valid)
        steps_beside += chooser.state == "warming"
        chooser.after_step(time.perf_counter() - start)
        burst = time.perf_counter()
        while time.perf_counter() - burst < 0.2:
            other(x)
    report = chooser.take_report()
    assert report["chosen"] == "compiled", report
    assert steps_beside > 10 and report["background_compile_s"] > 1.0  # the steps did run beside it
    assert any(files for _, _, files in os.walk(tmp_path / "inductor"))


def test_a_compile_that_fails_in_its_process_says_what_failed(monkeypatch, tmp_path):
    # The failure a user meets most: no working C++ compiler for inductor.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    model, mb, _ = tiny_vector_learner()
    inputs = {k: mb[k] for k in compiled_module.EVALUATE_INPUTS}
    said = compiled_module.compile_in_child(model, inputs, uniform_kl=False, threads=1)
    assert said is not None and "no-such-compiler" in said, said


def test_a_killed_learner_takes_its_compiling_process_with_it(tmp_path):
    # The learner below compiles cold (seconds) in its process: killed meanwhile,
    # it must leave nothing running.
    script = tmp_path / "learner.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{os.path.dirname(__file__)!r}, {REPO!r}]
        from test_compiled import tiny_vector_learner
        from fastrl.learning import compiled
        model, mb, _ = tiny_vector_learner()
        print("compiling", flush=True)
        compiled.compile_in_child(model, {{k: mb[k] for k in compiled.EVALUATE_INPUTS}}, uniform_kl=False, threads=1)
    """))
    learner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")))
    try:
        assert learner.stdout.readline().strip() == "compiling"
        children = []
        deadline = time.time() + 30
        while not children and learner.poll() is None and time.time() < deadline:
            children = psutil.Process(learner.pid).children()
            time.sleep(0.05)
        assert children, "no compiling process started"
        time.sleep(1.0)  # past its start, into the imports or the compile
        learner.kill()
        learner.wait(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], alive
    finally:
        learner.kill()


def _cmdline(process: psutil.Process) -> list:
    try:
        return process.cmdline()
    except psutil.Error:  # gone meanwhile
        return []


def test_a_killed_compiling_process_leaves_the_step_eager_and_says_so(monkeypatch, tmp_path):
    # A chaos run's SIGKILL, or the OOM killer: the run trains on, eagerly.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, mb, _ = tiny_vector_learner()
    chooser = CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False)
    chooser.before_step(mb)
    chooser.after_step(0.01)
    compiling = []  # this process may have other children (an earlier test's Doom reaper)
    deadline = time.time() + 30
    while not compiling and time.time() < deadline:
        compiling = [p for p in psutil.Process().children() if "fastrl.learning.warm_compile" in _cmdline(p)]
        time.sleep(0.05)
    assert len(compiling) == 1, compiling
    compiling[0].kill()
    chooser._warm.join(timeout=30)
    chooser.before_step(mb)
    report = chooser.take_report()
    assert report["chosen"] == "eager" and "killed (SIGKILL)" in report["why"], report
    assert "evaluate" not in model.__dict__


def forget_inductors_cache_dir(monkeypatch):
    """No TORCHINDUCTOR_CACHE_DIR, as in a fresh shell (inductor sets it in any
    process that compiled), put back as it was after the test."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")


def test_the_compile_keeps_inductors_cache_in_the_users_cache_unless_told_where(no_real_compile, monkeypatch,
                                                                                 tmp_path):
    # Inductor's default, /tmp/torchinductor_<user>, is emptied at boot on most
    # systems: every reboot meant minutes of a cold compile beside the next run.
    def start_compile():
        _, model, mb = small_image_model()
        chooser = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True)
        chooser.before_step(mb)
        chooser.after_step(1.0)
        chooser._warm.join(timeout=60)
        assert chooser._warm_error is None

    forget_inductors_cache_dir(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    start_compile()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "fastrl" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    start_compile()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    # What torch._dynamo's import sets, inductor's default, is no one's choice.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    start_compile()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "fastrl" / "inductor")


def test_an_inductor_cache_folder_others_can_write_is_not_used(monkeypatch, tmp_path):
    from fastrl.plumbing.compiling import use_inductor_cache

    forget_inductors_cache_dir(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shared = tmp_path / "cache" / "fastrl" / "inductor"
    shared.mkdir(parents=True)
    shared.chmod(0o777)  # anyone could plant compiled code here, which inductor would load
    use_inductor_cache()
    private = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert private != str(shared) and os.path.basename(private).startswith("fastrl-inductor-")
    assert os.stat(private).st_uid == os.getuid() and os.stat(private).st_mode & 0o777 == 0o700
    os.rmdir(private)


def test_the_first_step_and_the_compiles_start_leave_torch_dynamo_unimported(tmp_path):
    # The learner's first batch waits for its first step, whose end starts the
    # compile: importing torch._dynamo there cost it a second (inductor's module that
    # knows its default cache folder imports it). The compiling
    # process, stubbed here, imports it in its own process.
    code = textwrap.dedent("""
        import sys
        import gymnasium as gym
        import torch
        from fastrl.algo.model import build_model
        from fastrl.config import parse_args
        from fastrl.learning import compiled
        from fastrl.learning.adam import FusedAdam
        from fastrl.learning.learner import gradient_step
        from fastrl.tuning.profiling import _fake_minibatch
        compiled.compile_in_child = lambda *args: None
        cfg, _ = parse_args(["--env", "doom_basic", "--use_rnn", "true", "--rnn_size", "32", "--rollout", "4",
                             "--batch_size", "16"])
        image, actions = gym.spaces.Box(0, 255, (3, 36, 48), dtype="uint8"), gym.spaces.MultiDiscrete([3, 2])
        model = build_model(cfg, image, actions, "fp32")
        mb = _fake_minibatch(cfg, model, image, torch.Generator().manual_seed(0))
        chooser = compiled.CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True, setup_key="test")
        chooser.before_step(mb)
        gradient_step(cfg, model, FusedAdam(model.parameters(), lr=1e-3), mb, mb["valid"])
        chooser.after_step(1.0)
        assert chooser.take_started() == "background", chooser.state
        assert "torch._dynamo" not in sys.modules, "the first step or the compile's start imported torch._dynamo"
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env, timeout=120)


def test_on_keeps_the_compiled_step_without_timing_eager(no_real_compile):
    _, model, mb = small_image_model()
    report = drive(CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False), mb,
                   {"eager": 0.1, "compiled": 1.0})
    assert report["chosen"] == "compiled" and report["eager_step_s"] is None
    # Earlier runs' ratios judge nothing here, and the report does not say they did.
    report = drive(CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False, prior=[1.2]), mb,
                   {"eager": 0.1, "compiled": 1.0})
    assert report["chosen"] == "compiled" and report["prior_runs"] == 0 and report["judged_ratio"] is None


def test_a_compile_that_fails_leaves_the_step_eager_and_says_why(monkeypatch):
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn: pytest.fail("compiled after a failure"))
    monkeypatch.setattr(compiled_module, "compile_in_child",
                        lambda *args: "RuntimeError: no C++ compiler found")
    _, model, mb = small_image_model()
    report = drive(CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True), mb,
                   {"eager": 1.0, "compiled": 0.1})
    assert report["chosen"] == "eager" and "RuntimeError: no C++ compiler found" in report["why"]
    assert "evaluate" not in model.__dict__
    assert describe_compile(report).startswith("the learner's step stays eager: compiling failed (RuntimeError: no C++")


def test_auto_compiles_image_models_with_a_gru_on_a_cpu_alone():
    assert compiled_module.will_compile("auto", images=True, use_rnn=True, device_type="cpu")
    # On a GPU the compile's stall costs more than the faster step wins back there.
    assert not compiled_module.will_compile("auto", images=True, use_rnn=True, device_type="cuda")
    assert compiled_module.will_compile("on", images=True, use_rnn=True, device_type="cuda")
    assert not compiled_module.will_compile("auto", images=False, use_rnn=True, device_type="cpu")
    assert not compiled_module.will_compile("auto", images=True, use_rnn=False, device_type="cpu")
    assert not compiled_module.will_compile("off", images=True, use_rnn=True, device_type="cpu")


@pytest.mark.parametrize("mode, auto_compiles", [("off", True), ("auto", False)])
def test_no_compile_is_tried_where_none_is_wanted(monkeypatch, mode, auto_compiles):
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn: pytest.fail("compiled"))
    _, model, mb = small_image_model()
    chooser = CompiledEvaluate(model, mode, uniform_kl=False, auto_compiles=auto_compiles)
    assert drive(chooser, mb, {"eager": 1.0, "compiled": 0.1}) is None and chooser.state == "eager"


def test_a_run_with_the_compiled_step_says_so_and_records_it(tmp_path, monkeypatch):
    # A small recurrent model keeps the compile short (cold, as here in a cache of
    # the test's own, 30-50 s on 2 busy cores); `on` skips the timing, so the line
    # comes one step after it.
    forget_inductors_cache_dir(monkeypatch)
    cache = tmp_path / "cache"
    run = TrainRun(["--env", "CartPole-v1", "--use_rnn", "true", "--rnn_size", "16", "--rollout", "8",
                    "--compile_learner", "on", "--train_for_seconds", "240", "--train_dir", str(tmp_path),
                    "--status_every_seconds", "10"], env={"XDG_CACHE_HOME": str(cache)})
    try:
        run.wait_for_line(lambda line: "the learner's step runs compiled, asked for (--compile_learner on)" in line,
                          timeout=200)
        run.signal_group(signal.SIGINT)
        assert run.wait(timeout=60) == 128 + signal.SIGINT, run.output()
    finally:
        run.kill_all()
    report = read_summary(tmp_path, "CartPole-v1")["learner_compile"]
    assert report["chosen"] == "compiled" and report["compiled_step_s"] > 0, report
    # The slower steps while it compiled were announced, once, before the choice.
    said = [line for line in run.lines
            if line.startswith(("fastrl: compiling the learner's", "fastrl: the learner's step"))]
    assert said[0] == f"fastrl: {COMPILE_STARTED_LINES['background']}" and len(said) == 2, run.output()
    first_batch = next(i for i, line in enumerate(run.lines) if line.startswith("fastrl: first batch trained"))
    assert first_batch < run.lines.index(said[0]), run.output()  # the compile begins after the first step
    assert run.leftover_processes() == []
    assert os.listdir(cache / "fastrl" / "inductor")  # what it compiled outlives a reboot
    # The next run of the setup finds it marked in the cache: the learner compiles
    # in place, from the cache, with no process of its own.
    again = TrainRun(["--env", "CartPole-v1", "--use_rnn", "true", "--rnn_size", "16", "--rollout", "8",
                      "--compile_learner", "on", "--train_for_seconds", "120", "--train_dir", str(tmp_path / "again"),
                      "--status_every_seconds", "10"], env={"XDG_CACHE_HOME": str(cache)})
    try:
        again.wait_for_line(lambda line: "the learner's step runs compiled" in line, timeout=100)
        titles = set(again.titles.values())
        again.signal_group(signal.SIGINT)
        assert again.wait(timeout=60) == 128 + signal.SIGINT, again.output()
    finally:
        again.kill_all()
    said = [line for line in again.lines
            if line.startswith(("fastrl: compiling the learner's", "fastrl: the learner's step"))]
    assert said[0] == f"fastrl: {COMPILE_STARTED_LINES['in_place']}", again.output()
    assert "compiled from inductor's cache in" in said[1], again.output()
    report = read_summary(tmp_path / "again", "CartPole-v1")["learner_compile"]
    assert report["in_place"] and report["background_compile_s"] == 0 and report["chosen"] == "compiled"
    assert not any("warm_compile" in title for title in titles)


def marked_setup(monkeypatch, tmp_path):
    """A learner's model and minibatch, a setup key, and its own inductor cache and marks."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _, model, mb = small_image_model()
    return model, mb, "setup-of-this-test"


def test_a_compile_done_once_is_marked_and_the_next_compiles_in_place_from_the_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn: fn)
    children = []

    def child_fills_the_cache(*args):
        children.append(1)
        os.makedirs(tmp_path / "inductor" / "fxgraph", exist_ok=True)

    monkeypatch.setattr(compiled_module, "compile_in_child", child_fills_the_cache)
    model, mb, key = marked_setup(monkeypatch, tmp_path)
    first = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True, setup_key=key)
    report = drive(first, mb, {"eager": 1.0, "compiled": 0.8})
    assert children == [1] and not report["in_place"]
    assert "compiled in the background" in describe_compile(report)
    # The next run of the setup: no process, the compile at the step after the first.
    beats = []
    second = CompiledEvaluate(model, "auto", uniform_kl=False, auto_compiles=True, setup_key=key,
                              beat=lambda: beats.append(1))
    second.before_step(mb)
    second.after_step(1.0)
    assert second.state == "warming" and second._warm is None and second.take_started() == "in_place"
    second.before_step(mb)
    assert second.state == "timing" and second._current == "compiled"
    report = drive(second, mb, {"eager": 1.0, "compiled": 0.8})
    assert children == [1] and report["chosen"] == "compiled" and report["in_place"]
    assert report["background_compile_s"] == 0
    assert describe_compile(report).endswith(f"compiled from inductor's cache in {report['switch_s']:.1f} s")


def test_another_shape_thread_count_or_loss_is_not_marked(monkeypatch, tmp_path):
    model, mb, key = marked_setup(monkeypatch, tmp_path)
    inputs = {k: mb[k] for k in compiled_module.EVALUATE_INPUTS}
    mark = cache_mark(key, inputs, threads=1, uniform_kl=False)
    assert not cache_holds(mark)
    set_cache_mark(mark, True)
    os.makedirs(tmp_path / "inductor")
    assert not cache_holds(mark)  # the folder there but empty: nothing to compile from
    os.makedirs(tmp_path / "inductor" / "fxgraph")
    assert cache_holds(mark) and cache_holds(cache_mark(key, dict(inputs), threads=1, uniform_kl=False))
    wider = dict(inputs, actions=torch.cat([inputs["actions"]] * 2, dim=1))
    for other in (cache_mark("another setup", inputs, threads=1, uniform_kl=False),
                  cache_mark(key, wider, threads=1, uniform_kl=False),
                  cache_mark(key, inputs, threads=2, uniform_kl=False),
                  cache_mark(key, inputs, threads=1, uniform_kl=True)):
        assert not cache_holds(other)
    assert cache_mark("", inputs, threads=1) is None and not cache_holds(None)  # no key: never marked
    shutil.rmtree(tmp_path / "inductor")  # the cache itself gone (emptied by hand): compile in the background again
    assert not cache_holds(mark)
    set_cache_mark(mark, False)
    assert not os.path.exists(mark)


def test_a_failed_compile_leaves_no_mark_and_a_failed_in_place_call_removes_it(monkeypatch, tmp_path):
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn: fn)
    monkeypatch.setattr(compiled_module, "compile_in_child", lambda *args: "CppCompileError: no compiler")
    model, mb, key = marked_setup(monkeypatch, tmp_path)
    chooser = CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False, setup_key=key)
    report = drive(chooser, mb, {"eager": 1.0, "compiled": 0.5})
    assert report["chosen"] == "eager" and not os.path.exists(chooser._mark)
    # Marked, but the learner's own compile fails (a cache emptied beneath it, say):
    # that step runs eagerly, the run stays eager, and the mark goes.
    set_cache_mark(chooser._mark, True)
    os.makedirs(tmp_path / "inductor" / "fxgraph")

    def failing(fn):
        def call(*args, **kwargs):
            raise RuntimeError("inductor fell over")
        return call

    monkeypatch.setattr(compiled_module.torch, "compile", failing)
    again = CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False, setup_key=key)
    again.before_step(mb)
    again.after_step(1.0)
    again.before_step(mb)
    assert again._warm is None and again.state == "timing"  # it compiles in place
    out = model.evaluate(mb["obs"], mb["rnn_state0"], mb["episode_start"], mb["actions"])  # the first compiled call
    assert out.values.shape[1:] == mb["rewards"].shape[1:]  # answered all the same, eagerly
    report = again.take_report()
    assert report["chosen"] == "eager" and "inductor fell over" in report["why"] and again.state == "eager"
    assert describe_compile(report).endswith("compiling from inductor's cache")
    assert not os.path.exists(again._mark)


def slow_compile(fn):
    """torch.compile as a pause of two and a half heartbeats, then the function itself."""
    def call(*args, **kwargs):
        time.sleep(2.5 * BEAT_EVERY_S)
        return fn(*args, **kwargs)
    return call


def test_the_learners_own_compile_keeps_its_heartbeat(monkeypatch, tmp_path):
    monkeypatch.setattr(compiled_module.torch, "compile", slow_compile)
    monkeypatch.setattr(compiled_module, "compile_in_child", lambda *args: None)
    _, model, mb = small_image_model()
    beats = []
    chooser = CompiledEvaluate(model, "on", uniform_kl=False, auto_compiles=False, beat=lambda: beats.append(1))
    chooser.before_step(mb)
    chooser.after_step(1.0)
    chooser._warm.join(timeout=60)
    chooser.before_step(mb)  # the switch
    model.evaluate(mb["obs"], mb["rnn_state0"], mb["episode_start"], mb["actions"])  # the first compiled call
    assert len(beats) == 2
