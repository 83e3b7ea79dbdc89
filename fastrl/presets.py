"""Per-env-family defaults for envs whose costs and dynamics differ from classic
control. Explicit options always win; these replace only the trainer's defaults."""
from __future__ import annotations

# Pixel envs: one shared conv encoder (a second for the critic would double the main
# cost), a GRU, one pass per batch (samples are cheap to make, costly to learn from).
_PIXELS = {
    "separate_critic": False,
    "use_rnn": True,
    "rnn_size": 512,
    "ppo_epochs": 1,
    "num_minibatches": 1,
    "lr": 1e-4,
    "entropy_coef": 0.003,
    "gamma": 0.99,
    "rollout": 32,
    "batch_size": 1024,
    "max_grad_norm": 4.0,
}

# Doom: Sample Factory's loss settings plus a policy head at gain 1 get past the "turn
# and fire" plateau, where neither alone does; the KL-to-uniform term keeps exploring
# where an entropy bonus fades, and the tight clips keep a lagged policy's steps small.
# Chosen by benchmarks/learning_suite.py.
_DOOM_LEARNING = {
    "exploration_loss": "symmetric_kl",
    "entropy_coef": 0.001,
    "clip_ratio": 0.1,
    "value_clip": 0.2,
    "vtrace_lambda": 0.95,
    "normalize_obs": True,
    "policy_init_gain": 1.0,
}

PRESETS = {
    # Doom steps are slow: two workers keep both cores stepping while the learner trains.
    "doom_": {**_PIXELS, **_DOOM_LEARNING, "num_workers": 2, "num_envs_per_worker": 8},
    # Atari: PPO's own on-policy regime (several passes over minibatches of single steps)
    # with rl-zoo3's settings; the asynchronous single pass lagged SB3 on Breakout.
    "atari_": {**_PIXELS, "num_workers": 2, "num_envs_per_worker": 8, "lr": 2.5e-4, "entropy_coef": 0.01,
               "use_rnn": False, "ppo_epochs": 4, "num_minibatches": 4, "max_batches_ahead": 0,
               "minibatch_split": "samples", "conv_stack": "nature", "conv_activation": "relu",
               "vtrace_lambda": 0.95, "clip_ratio": 0.1, "max_grad_norm": 0.5, "adam_eps": 1e-5,
               "reward_clip": 1.0, "normalize_returns": False, "value_coef": 1.0},
}


# Single envs, on top of their family's preset; chosen by benchmarks/learning_suite.py.
ENV_PRESETS = {
    # doom_basic: rewards (+101 a kill) scaled to ~1; short and reactive, so many small
    # updates without a GRU win. It keeps the plain loss it was tuned with but for the
    # family's KL-to-uniform term, without which long runs collapse onto one action.
    "doom_basic": {"reward_scale": 0.01, "use_rnn": False, "lr": 1e-3, "batch_size": 256,
                   "normalize_returns": False, "entropy_coef": 0.003,
                   "clip_ratio": 0.2, "value_clip": 0.0, "vtrace_lambda": 1.0, "normalize_obs": False,
                   "policy_init_gain": 0.01},
}


# Continuous actions (known only once an env is made, so applied by preset_for_spaces):
# a large step, braked by --target_kl so it does not fall back. The two go together.
_CONTINUOUS_ACTIONS = {"lr": 1e-3, "target_kl": 0.01}

# Vector observations: GAE's usual lambda 0.95, faster than 1 on classic control;
# image envs keep 1 unless their family sets its own.
_VECTOR_OBSERVATIONS = {"vtrace_lambda": 0.95}

# Continuous control (continuous actions from vector observations, as MuJoCo's tasks):
# observations normalised, as their parts differ in scale by orders of magnitude (joint
# angles against velocities); without it Walker2d-v5 stalled near 1,000. Actions start
# at a std of exp(-1) half-widths, not 1: a walker thrown about by full-range noise falls
# before it learns anything; and minibatches dealt from single steps mix many envs and
# moments. Together they multiplied Ant-v5's return at 500k env steps and more than
# doubled Walker2d-v5's at 1M; Hopper-v5's stayed within its seed-to-seed spread, and
# Pendulum-v1 kept its time to target (benchmarks/learning_suite.py --at_frames).
_CONTINUOUS_CONTROL = {"normalize_obs": True, "log_std_init": -1.0, "minibatch_split": "samples"}

# Continuous control, too: its returns climb, then can give back half their rise within
# minutes, at every learning rate, schedule and KL brake measured, and so do deterministic
# evaluations of the policy. An evaluator keeps the best policy it sees in checkpoints/best.pt;
# it runs niced on one thread and moved neither the first batch nor Pendulum-v1's time to
# target past their spread (benchmarks/startup.py; benchmarks/learning_suite.py, where best.pt
# was also replayed against the last checkpoint).
_KEEP_BEST_POLICY = {"eval_every_frames": 250_000, "eval_episodes": 10}


# Gymnasium's MuJoCo locomotion tasks that end when the body falls, on top of continuous
# control: four passes at a rate a third as large, which the KL brake lets use most of each
# batch, not its first minibatch. Their simulator's steps cost far more than a learner's
# pass, so the passes cost few frames; Hopper-v5, Walker2d-v5 and Humanoid-v5 learned more
# per env step and per second, Ant-v5 as much. HalfCheetah-v5 (it never falls) reached its
# target later with them, and Pendulum-v1 lost frames to them: both are left out
# (benchmarks/learning_suite.py --at_frames).
_LOCOMOTION = {"lr": 3e-4, "ppo_epochs": 4}
LOCOMOTION_TASKS = ("Hopper", "Walker2d", "Ant", "Humanoid")

# Walker2d, in a run with a budget: PPO's own regime, on policy, ten passes of 16 minibatches
# braked at a KL of 0.02, the rate annealed to 0 where the budget ends. It learned more per env
# step and within 10 and 30 minutes, and gave back less of its best; the asynchronous defaults
# wander there. The annealed rate needs the budget (at a constant rate the regime collapsed), so
# a run without one keeps the defaults. Within 10 minutes Hopper-v5 reached its target later
# with it and Humanoid-v5 ended a little lower; Ant-v5 got about as high per step
# (benchmarks/learning_suite.py --at_frames); over 30 minutes it left Hopper-v5 lower and no steadier.
_ON_POLICY_WITH_BUDGET = {"max_batches_ahead": 0, "ppo_epochs": 10, "num_minibatches": 16, "target_kl": 0.02,
                          "lr_schedule": "linear"}
ON_POLICY_TASKS = ("Walker2d",)


def preset_for(env_name: str) -> dict:
    """The defaults an env's name brings: its family's (PRESETS), then its own."""
    values = {}
    for prefix, family in PRESETS.items():
        if env_name.startswith(prefix):
            values.update(family)
    values.update(ENV_PRESETS.get(env_name, {}))
    return values


def preset_for_spaces(env_name: str, obs_space, action_space, budgeted: bool = False) -> dict:
    """The defaults an env's observation and action spaces bring (and, for the MuJoCo
    tasks in LOCOMOTION_TASKS, their family's; for those in ON_POLICY_TASKS, in a run
    with a budget, PPO's regime), for the options its name's presets leave alone: a
    doom_* or single-env preset is tuned as a whole and keeps its own values."""
    import gymnasium

    named = preset_for(env_name)
    groups = []
    vector = isinstance(obs_space, gymnasium.spaces.Box) and len(obs_space.shape) == 1
    continuous = isinstance(action_space, gymnasium.spaces.Box)
    if vector:
        groups.append(_VECTOR_OBSERVATIONS)
    if continuous:
        groups.append(_CONTINUOUS_ACTIONS)
    if vector and continuous:
        groups += [_CONTINUOUS_CONTROL, _KEEP_BEST_POLICY]
        if is_locomotion_task(env_name):
            groups.append(_LOCOMOTION)
            if budgeted and _task_name(env_name) in ON_POLICY_TASKS:
                groups.append(_ON_POLICY_WITH_BUDGET)
    values = {}
    for group in groups:  # a group's values were measured together: all of it, or none
        if not named.keys() & group.keys():
            values.update(group)
    return values


def is_locomotion_task(env_name: str) -> bool:
    """Whether `env_name` is one of gymnasium's own MuJoCo tasks in LOCOMOTION_TASKS (any
    version), not a user's env that shares its name."""
    import gymnasium

    spec = gymnasium.envs.registry.get(env_name)
    entry = spec.entry_point if spec is not None else None
    return (isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco.")
            and _task_name(env_name) in LOCOMOTION_TASKS)


def _task_name(env_name: str) -> str:
    """A gymnasium id without its version: "Walker2d" for "Walker2d-v5"."""
    return env_name.rsplit("-v", 1)[0]
