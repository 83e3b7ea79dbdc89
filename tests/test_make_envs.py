"""make_envs: the envs of a rollout worker, made at once where the env allows it."""
import os
import threading
import time

import pytest
from fastrl.envs.registry import EnvSpec, get_spec

from fastrl.sampling.env_split import make_envs


class FakeEnv:
    def __init__(self, seed):
        self.seed, self.closed, self.thread = seed, False, threading.current_thread()

    def close(self):
        self.closed = True


class Recorder:
    """A make that records how many envs were being made at once."""

    def __init__(self, fail_seed=None):
        self.lock, self.now, self.most, self.made = threading.Lock(), 0, 0, []
        self.fail_seed = fail_seed

    def __call__(self, seed=None, **options):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.05)
        with self.lock:
            self.now -= 1
        if seed == self.fail_seed:
            raise ValueError(f"seed {seed} cannot be made")
        env = FakeEnv(seed)
        self.made.append(env)
        return env


@pytest.mark.parametrize("parallel", [True, False])
def test_envs_come_in_seed_order_made_at_once_only_where_allowed(parallel):
    """Where the env allows it; a gymnasium env is not known to be thread-safe to make."""
    make = Recorder()
    made_here = []
    envs = make_envs(EnvSpec("fake", make, parallel_make=parallel), {}, list(range(10)),
                     on_env_made=lambda: made_here.append(1), threads=4)
    assert [env.seed for env in envs] == list(range(10)) and len(made_here) == 10
    assert envs[0].thread is threading.main_thread()  # the first alone, where signal hooks may be set
    if parallel:
        assert make.most > 1
    else:
        assert make.most == 1 and all(env.thread is threading.main_thread() for env in envs)


def test_one_thread_makes_them_one_after_another():
    make = Recorder()
    envs = make_envs(EnvSpec("fake", make, parallel_make=True), {}, list(range(5)), threads=1)
    assert make.most == 1 and [env.seed for env in envs] == list(range(5))


def test_a_failed_env_closes_the_others_and_raises():
    make = Recorder(fail_seed=5)
    with pytest.raises(ValueError, match="seed 5"):
        make_envs(EnvSpec("fake", make, parallel_make=True), {}, list(range(10)), threads=4)
    assert len(make.made) == 9 and all(env.closed for env in make.made)


def test_doom_games_made_at_once_step_and_leave_stderr_alone():
    pytest.importorskip("vizdoom")
    stderr_before = os.fstat(2)
    spec = get_spec("doom_basic")
    assert spec.parallel_make
    envs = make_envs(spec, {}, [1, 2, 3, 4], threads=3)
    try:
        for env in envs:
            env.reset()
            env.step(env.action_space.sample())
        assert len({env._handle.engine_pid for env in envs}) == 4
    finally:
        for env in envs:
            env.close()
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (stderr_before.st_dev, stderr_before.st_ino)
