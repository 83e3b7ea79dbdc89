"""Stable-Baselines3 PPO with rl-zoo3's tuned hyperparameters, stopped by wall time,
reporting the way `fastrl.train` does. The SB3 side of benchmarks/learning_suite.py.

    python benchmarks/sb3_runner.py --env CartPole-v1 --seed 0 --seconds 300 --exp_dir /tmp/ls/sb3/CartPole-v1_s0

Install: pip install stable-baselines3 "gymnasium[box2d,mujoco]"   (box2d for LunarLander, mujoco for Hopper...)

Every --report_seconds of wall time it prints a status line in fastrl's format,

    [   12.0s] frames 12,345 | 1,234 fps (env frames/s) | return(100) 23.45 | episodes 120

with seconds counted from this process's launch (imports included, as fastrl counts),
frames = env steps summed over the vectorized envs (these envs have no frameskip, so
steps and frames are the same thing) and return(100) = the mean return of the last
(up to) 100 episodes that SB3's Monitor wrapper recorded, `nan` before the first.
The same numbers go to TensorBoard in <exp_dir>/tb under fastrl's tags
(train/return_mean_100, train/fps, train/episodes, time/wall_seconds; step = env
frames), so `python -m fastrl.plot` draws this run beside fastrl's.

It stops at the first env step past --seconds from launch. SB3 calls back only
between env steps, so a gradient phase that straddles the deadline runs to its end
first (LunarLander's longest, 16 x 1024 samples x 4 epochs, takes seconds here);
the status line printed at the stop says when it really stopped. It also stops
when it has trained rl-zoo3's n_timesteps, whichever comes first: the zoo's linear
schedules decay to zero at that point, so training on would change nothing.
"""
from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import math
import os
import sys
import time

from fastrl.plumbing.proc import launched_at


def linear(initial: float):
    """rl-zoo3's `lin_<x>`: x times the fraction of n_timesteps still to train."""
    return lambda progress_remaining: progress_remaining * initial


# PPO hyperparameters from rl-zoo3's hyperparams/ppo.yml (DLR-RM/rl-baselines3-zoo),
# copied by value. n_envs and n_timesteps are the zoo's too; policy is MlpPolicy for
# all three. LunarLander-v3 uses the zoo's LunarLander-v2 entry: gymnasium 1.x renamed
# the env (v3 fixed bugs in v2's physics); the zoo has no separate v3 tuning.
ZOO_PPO = {
    "CartPole-v1": dict(n_envs=8, n_timesteps=100_000, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                        n_epochs=20, ent_coef=0.0, learning_rate=linear(0.001), clip_range=linear(0.2)),
    "LunarLander-v3": dict(n_envs=16, n_timesteps=1_000_000, n_steps=1024, batch_size=64, gae_lambda=0.98,
                           gamma=0.999, n_epochs=4, ent_coef=0.01),
    "Pendulum-v1": dict(n_envs=4, n_timesteps=100_000, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10,
                        ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4),
}


def _zoo_mujoco_policy() -> dict:
    """policy_kwargs of rl-zoo3's tuned MuJoCo entries (Hopper, HalfCheetah, Humanoid): two 256-unit ReLU
    layers for each of actor and critic, no orthogonal init, log-std starting at -2."""
    from torch import nn

    return dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256]))


# The MuJoCo locomotion family, gymnasium's v5 ids with the zoo's v3 entries (the zoo has
# none for v5; v5 fixed bugs without changing the tasks' scale). `normalize`: the zoo wraps
# the envs in VecNormalize (observations and rewards, rewards at the algorithm's gamma);
# `policy_kwargs` is built when used, so that this module imports without torch.nn.
ZOO_MUJOCO = {
    "Hopper-v5": dict(normalize=True, n_envs=1, n_timesteps=1_000_000, batch_size=32, n_steps=512, gamma=0.999,
                      learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2, n_epochs=5, gae_lambda=0.99,
                      max_grad_norm=0.7, vf_coef=0.835671, policy_kwargs=_zoo_mujoco_policy),
    "Walker2d-v5": dict(normalize=True, n_envs=1, n_timesteps=1_000_000, batch_size=32, n_steps=512, gamma=0.99,
                        learning_rate=5.05041e-05, ent_coef=0.000585045, clip_range=0.1, n_epochs=20,
                        gae_lambda=0.95, max_grad_norm=1.0, vf_coef=0.871923),
    "HalfCheetah-v5": dict(normalize=True, n_envs=1, n_timesteps=1_000_000, batch_size=64, n_steps=512, gamma=0.98,
                           learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1, n_epochs=20,
                           gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096, policy_kwargs=_zoo_mujoco_policy),
    # The zoo's untuned `mujoco-defaults`: SB3's PPO defaults with normalisation.
    "Ant-v5": dict(normalize=True, n_envs=1, n_timesteps=1_000_000),
    "Humanoid-v5": dict(normalize=True, n_envs=1, n_timesteps=10_000_000, batch_size=256, n_steps=512, gamma=0.95,
                        learning_rate=3.56987e-05, ent_coef=0.00238306, clip_range=0.3, n_epochs=5, gae_lambda=0.9,
                        max_grad_norm=2.0, vf_coef=0.431892, policy_kwargs=_zoo_mujoco_policy),
}
ZOO_PPO.update(ZOO_MUJOCO)

# rl-zoo3's `atari` entry, which it uses for every Atari game, with the game's
# NoFrameskip-v4 id: ALE's own frameskip off and no sticky actions, SB3's AtariWrapper
# doing the DQN-era preprocessing (30 no-ops at most, 4-frame skip with a max over the
# last two, a life lost ends the episode, FIRE at reset, 84x84 gray, rewards clipped)
# and 4 frames stacked: what fastrl's atari_<game> plays by default. SB3's Monitor
# sits inside those wrappers, so its episode is a whole game at the game's own score,
# as fastrl's objective(100) is.
ZOO_ATARI = dict(n_envs=8, n_timesteps=10_000_000, n_steps=128, n_epochs=4, batch_size=256,
                 learning_rate=linear(2.5e-4), clip_range=linear(0.1), vf_coef=0.5, ent_coef=0.01)
PAST_BUDGET_STEPS = 10**12  # --past_zoo_budget's total_timesteps: no run reaches it


def scheduled_envs() -> list:
    """The envs whose zoo settings include a schedule (a function of progress)."""
    settings = {**ZOO_PPO, **{name: ZOO_ATARI for name in ATARI_IDS}}
    return [env for env, zoo in settings.items() if any(callable(v) for k, v in zoo.items() if k != "policy_kwargs")]


ATARI_IDS = {"atari_breakout": "BreakoutNoFrameskip-v4", "atari_pong": "PongNoFrameskip-v4"}
ATARI_FRAME_STACK = 4
ATARI_FRAMESKIP = 4  # AtariWrapper's: SB3 counts agent steps, the suite counts frames
ZOO_PPO.update({name: ZOO_ATARI for name in ATARI_IDS})

SB3_INSTALL = "pip install stable-baselines3"


def status_line(elapsed: float, frames: int, fps: float, mean_return: float, episodes: int) -> str:
    """fastrl's status line, less the fields SB3 has no counterpart for (trained
    samples/s, policy lag): learning_suite.py parses both with one pattern."""
    return (f"[{elapsed:7.1f}s] frames {frames:,} | {fps:,.0f} fps (env frames/s)"
            f" | return(100) {mean_return:.2f} | episodes {episodes:,}")


def make_reporter(base_callback, launched: float, seconds: float, report_seconds: float, tb_dir: str,
                  frameskip: int = 1):
    """A BaseCallback subclass instance (SB3's class, passed in so that this module
    imports without SB3) that reports, logs and stops on time. `frameskip`: env
    frames per agent step, for the frame counts."""
    from torch.utils.tensorboard import SummaryWriter

    class Reporter(base_callback):
        def __init__(self):
            super().__init__()
            self.returns = collections.deque(maxlen=100)
            self.episodes = 0
            self.writer = SummaryWriter(tb_dir)
            self.last_report = (0.0, 0)  # (seconds since launch, frames) at the previous report
            self.stop_reason = ""

        def mean_return(self) -> float:
            return sum(self.returns) / len(self.returns) if self.returns else math.nan

        def report(self) -> None:
            elapsed, frames = time.time() - launched, self.num_timesteps * frameskip
            fps = (frames - self.last_report[1]) / max(elapsed - self.last_report[0], 1e-9)
            mean = self.mean_return()
            print(status_line(elapsed, frames, fps, mean, self.episodes), flush=True)
            self.writer.add_scalar("time/wall_seconds", elapsed, frames)
            self.writer.add_scalar("train/fps", fps, frames)
            self.writer.add_scalar("train/episodes", float(self.episodes), frames)
            if not math.isnan(mean):  # fastrl leaves it out too: a NaN would break the curve
                self.writer.add_scalar("train/return_mean_100", mean, frames)
            self.writer.flush()
            self.last_report = (elapsed, frames)

        def _on_step(self) -> bool:
            # Monitor (added by make_vec_env) puts {"r": return, "l": length, ...} in the
            # info of an episode's last step.
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
                    self.episodes += 1
            elapsed = time.time() - launched
            if elapsed >= seconds:
                self.stop_reason = f"trained for {seconds:g} s"
                return False
            if elapsed - self.last_report[0] >= report_seconds:
                self.report()
            return True

        def _on_training_end(self) -> None:
            self.stop_reason = self.stop_reason or f"trained rl-zoo3's n_timesteps ({self.model._total_timesteps:,})"
            self.report()
            self.writer.close()

    return Reporter()


def fastrl_atari_env(name: str):
    """fastrl's Atari env (frames stacked inside) as SB3 trains on it: rewards
    clipped to their sign, and a whole game's score put where the reporter looks
    for Monitor's ("episode" in the info of the game's last step)."""
    import gymnasium
    import numpy as np
    from fastrl.envs.registry import get_spec

    class SignedRewardsGameScores(gymnasium.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.game_steps = 0

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.game_steps += 1
            if "true_objective" in info:  # SB3 logs Monitor's keys: return, length, time
                info = {**info, "episode": {"r": info["true_objective"], "l": self.game_steps, "t": 0.0}}
                self.game_steps = 0
            return obs, float(np.sign(reward)), terminated, truncated, info

    return SignedRewardsGameScores(get_spec(name).make())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--env", required=True, choices=sorted(ZOO_PPO), help="gymnasium env id (one the zoo tuned)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the envs, the policy and SB3's sampling")
    parser.add_argument("--seconds", type=float, required=True, help="wall-time budget from this process's launch")
    parser.add_argument("--exp_dir", required=True, help="experiment folder; TensorBoard events go to <exp_dir>/tb")
    parser.add_argument("--report_seconds", type=float, default=5.0, help="seconds between status lines")
    parser.add_argument("--torch_threads", type=int, default=0,
                        help="torch intra-op threads (default 0: 1 for an MLP policy, torch's own default, one per "
                             "core, for Atari's CNN; rl-zoo3's --num-threads sets the same)")
    parser.add_argument("--fastrl_env", action="store_true",
                        help="Atari only: train on fastrl's own Atari env (envs/atari.py: its frame stack, episodic "
                             "life and FIRE), rewards clipped to their sign as SB3's AtariWrapper does, instead of "
                             "SB3's wrappers: tells an env difference from a trainer difference")
    parser.add_argument("--past_zoo_budget", action="store_true",
                        help="train on past rl-zoo3's n_timesteps until --seconds, to time a target that the zoo's "
                             "budget ends short of (only where the zoo's settings are constant, not schedules)")
    args = parser.parse_args(argv)
    if args.past_zoo_budget and args.env in scheduled_envs():
        parser.error(f"--past_zoo_budget is for envs whose zoo settings are constant; {args.env}'s decay to zero "
                     f"at n_timesteps, so training past it would train at zero (constant ones: "
                     f"{', '.join(sorted(set(ZOO_PPO) - set(scheduled_envs())))})")
    if args.fastrl_env and args.env not in ATARI_IDS:
        parser.error(f"--fastrl_env is for the Atari envs ({', '.join(sorted(ATARI_IDS))}), not {args.env}")
    launched = launched_at()  # fastrl's own reading, so both count from the same kind of clock

    if importlib.util.find_spec("stable_baselines3") is None:
        print(f"sb3_runner: error: Stable-Baselines3 is not installed; run: {SB3_INSTALL}", file=sys.stderr)
        return 2
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    # An MLP policy gets one thread, not torch's default of one per core: these are
    # 64x64 MLPs on batches of 64-256, too small to split, and on this 2-core machine
    # two OpenMP threads sharing the cores with any other busy process made every
    # CartPole update take seconds (45 env frames/s against 5,800 with one thread,
    # measured). Atari's CNN is the other way: 1,059 env frames/s on Breakout with
    # torch's 2 threads against 649 with one (50 s each).
    threads = args.torch_threads or (torch.get_num_threads() if args.env in ATARI_IDS else 1)
    torch.set_num_threads(threads)
    zoo = dict(ZOO_PPO[args.env])
    n_envs, n_timesteps, normalize = zoo.pop("n_envs"), zoo.pop("n_timesteps"), zoo.pop("normalize", False)
    if callable(zoo.get("policy_kwargs")):
        zoo["policy_kwargs"] = zoo["policy_kwargs"]()
    # DummyVecEnv (the zoo's default too, Atari included): the envs step in this
    # process, one after another. These envs step in microseconds; SubprocVecEnv's
    # pipes would cost more.
    if args.fastrl_env:
        from stable_baselines3.common.vec_env import DummyVecEnv

        env = DummyVecEnv([functools.partial(fastrl_atari_env, args.env) for _ in range(n_envs)])
        env.seed(args.seed)
        policy, frameskip = "CnnPolicy", ATARI_FRAMESKIP
    elif args.env in ATARI_IDS:
        import ale_py
        import gymnasium
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        gymnasium.register_envs(ale_py)  # gymnasium 1.x finds ALE's ids only once registered
        env = VecFrameStack(make_atari_env(ATARI_IDS[args.env], n_envs=n_envs, seed=args.seed),
                            n_stack=ATARI_FRAME_STACK)
        policy, frameskip = "CnnPolicy", ATARI_FRAMESKIP
    else:
        env = make_vec_env(args.env, n_envs=n_envs, seed=args.seed)
        policy, frameskip = "MlpPolicy", 1
    if normalize:  # outside Monitor, which so records the env's own returns
        from stable_baselines3.common.vec_env import VecNormalize

        env = VecNormalize(env, gamma=zoo.get("gamma", 0.99))
    # device="cpu": SB3 itself advises against a GPU for PPO with an MLP policy.
    model = PPO(policy, env, seed=args.seed, device="cpu", verbose=0, **zoo)
    reporter = make_reporter(BaseCallback, launched, args.seconds, args.report_seconds,
                             os.path.join(args.exp_dir, "tb"), frameskip)
    print(f"sb3: PPO on {args.env}, {n_envs} envs, rl-zoo3 hyperparameters; experiment in {args.exp_dir}", flush=True)
    # Past the zoo's budget the --seconds deadline is the only stop.
    model.learn(total_timesteps=PAST_BUDGET_STEPS if args.past_zoo_budget else n_timesteps, callback=reporter)
    env.close()
    wall = time.time() - launched
    print(f"sb3: {reporter.stop_reason}; {model.num_timesteps * frameskip:,} env frames in {wall:.1f} s, "
          f"mean return(100) {reporter.mean_return():.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
