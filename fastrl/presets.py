"""Per-env-family training defaults: what the trainer's defaults become for
envs whose costs and dynamics differ from classic control. The user's explicit
options always win; these replace only the defaults. (Kept in the trainer, not
in envs/, because they are trainer options: envs know nothing of the trainer.)
"""
from __future__ import annotations

# Pixel envs: one shared conv encoder (a second one for the critic would double
# the dominant cost), a GRU core, one pass over each batch (APPO's usual regime:
# samples are cheap to make and expensive to learn from), a smaller step size.
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

# Doom: past the "turn and fire" plateau. With the entropy bonus, clip 0.2 and no
# value clip, every policy trained on doom_defend_the_center sat at a return of
# ~3 and acted the same whatever the frame showed; Sample Factory's loss settings
# together with a policy head initialised at gain 1 (not 0.01) took it to 4.4-5.9
# in 300 s on 3 seeds, and the agent aims (benchmarks/README.md, tenth session).
# Neither half did it alone. The KL-to-uniform term keeps pulling towards
# exploration where an entropy bonus's pull fades; the tighter clip and the value
# clip keep a lagged policy's steps small.
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
    # Doom steps cost ~1 ms each: two workers keep both cores stepping while the
    # learner trains; 8 envs each fill a 1024 batch in four 32-step rollouts.
    "doom_": {**_PIXELS, **_DOOM_LEARNING, "num_workers": 2, "num_envs_per_worker": 8},
    # Atari: PPO's own regime. With the pixel family's asynchronous single pass,
    # Breakout scored 2.7 after 8 minutes on 2 cores where SB3's rl-zoo3 PPO scored
    # 4.5-7.9, and no hyperparameter closed it. What did (benchmarks/README.md,
    # twenty-fourth session): on-policy batches (sampling waits for each batch to be
    # trained), 4 passes of 4 minibatches of single steps drawn from every
    # trajectory, and targets computed once per batch before its first step; then
    # rl-zoo3's settings (clip 0.1, lambda 0.95, gradient norm 0.5, rewards clipped
    # to their sign, the DQN paper's encoder) in place of the Doom-tuned ones.
    "atari_": {**_PIXELS, "num_workers": 2, "num_envs_per_worker": 8, "lr": 2.5e-4, "entropy_coef": 0.01,
               "use_rnn": False, "ppo_epochs": 4, "num_minibatches": 4, "max_batches_ahead": 0,
               "minibatch_split": "samples", "conv_stack": "nature", "conv_activation": "relu",
               "vtrace_lambda": 0.95, "clip_ratio": 0.1, "max_grad_norm": 0.5, "adam_eps": 1e-5,
               "reward_clip": 1.0, "normalize_returns": False, "value_coef": 1.0},
}


# Single envs on top of their family's preset.
ENV_PRESETS = {
    # basic's rewards are +101 for the kill and -5 a missed shot: scaled to ~1. The
    # task is reactive (no memory needed) and short, so many small updates win:
    # measured on 2 cores, mean return -180 -> +20 in 80 s with these, still about
    # -150 after 90 s with the family's batch 1024, lr 1e-4 and GRU. With the rewards
    # already scaled to ~1 and no GRU to saturate, z-scored returns only slowed it:
    # a mean of 60 at 0.8M frames instead of 0.2M, and 55-66 after where raw returns
    # held 73-76 (AMD EPYC, 2 cores, seed 0, one 300-s run each).
    # The Doom family's clip, value clip, lambda, input normalisation and head gain
    # (above) broke it: -93 at 300 s (0.74M frames) where these reached 75.7 (seed
    # 0, same machine), so it keeps the loss it was tuned with, but for the
    # exploration term: the family's KL to uniform at the entropy bonus's old weight.
    # (The family's preset as a whole, its lr 1e-4, batch 1024 and GRU included, does
    # learn it, at Sample Factory's pace: 80 at 213 s on seed 0 against this
    # preset's 91 s, same hour, twenty-second session. At the family's weight 0.001
    # this preset stayed at 74-78 for 300 s on seeds 0-1; at 0.01 it reached 80
    # sooner, 70 s median against 91 on seeds 0-2, but a 30-minute run held 80 on
    # 267 of 299 reports from minute 5 against 0.003's 279-290 of 300: the weight
    # stays 0.003.)
    # With the bonus alone a 30-minute run went nearly deterministic, one large step
    # left 'fire' at p ~ 1e-33 and the bonus, whose pull fades with p, never brought
    # it back (-300 from minute 21); with the KL term three seeds reached 80 in
    # 95-166 s and a 30-minute run held 80-83 (benchmarks/README.md, twelfth session).
    "doom_basic": {"reward_scale": 0.01, "use_rnn": False, "lr": 1e-3, "batch_size": 256,
                   "normalize_returns": False, "entropy_coef": 0.003,
                   "clip_ratio": 0.2, "value_clip": 0.0, "vtrace_lambda": 1.0, "normalize_obs": False,
                   "policy_init_gain": 0.01},
}


# Continuous actions (a Box action space), whatever the env's name. Known only once
# an env is made, so applied then (preset_for_spaces), under the name's presets.
# A large step with a brake on it: at lr 1e-3 alone Pendulum-v1 reaches -200 fast
# and then falls back for seconds at a time (25 reports under -250 after reaching
# it, on 3 seeds); the smaller 3e-4 held (0) but took 1.7x as long to get there.
# With the batch's passes ended once the policy has moved a KL of 0.01 from the
# batch's start (--target_kl), lr 1e-3 reached -200 in 36.7 s median over 6 seeds
# against 3e-4's 62.3 s over 3 in the same hour, held as well (last 30 s -162
# against -167) and trained more frames (most batches end after a few steps); a
# bound of 0.03 was as fast (34.6 s) and fell back more (17 reports under -250 on 6
# seeds against 5). Zen 3 EPYC, 2 cores; benchmarks/README.md, thirty-fourth
# session. The two go together: where a name's presets set either, neither applies.
# CartPole and LunarLander (discrete) take the default 2e-3, where they are fastest.
_CONTINUOUS_ACTIONS = {"lr": 1e-3, "target_kl": 0.01}

# Vector observations (classic control), whatever the actions: V-trace's lambda 0.95
# (GAE's usual lambda). Against lambda 1, same hour, AMD EPYC: LunarLander-v3 reached
# 200 at 341 s median against 452 s (6.6-7.7M frames against 9.0-10.5M), CartPole-v1
# 300 at 3.9 s against 4.3 s, Pendulum-v1 -200 at 40.2 s against 50.3 s
# (benchmarks/README.md, twentieth session). Image envs were not measured with it, so
# they keep 1; the Doom family sets its own 0.95 among the settings it was tuned with.
_VECTOR_OBSERVATIONS = {"vtrace_lambda": 0.95}


def preset_for(env_name: str) -> dict:
    """The defaults an env's name brings: its family's (PRESETS), then its own."""
    values = {}
    for prefix, family in PRESETS.items():
        if env_name.startswith(prefix):
            values.update(family)
    values.update(ENV_PRESETS.get(env_name, {}))
    return values


def preset_for_spaces(env_name: str, obs_space, action_space) -> dict:
    """The defaults an env's observation and action spaces bring, for the options
    its name's presets leave alone: a doom_* or single-env preset is tuned as a
    whole and keeps its own values."""
    import gymnasium

    named = preset_for(env_name)
    groups = []
    if isinstance(obs_space, gymnasium.spaces.Box) and len(obs_space.shape) == 1:
        groups.append(_VECTOR_OBSERVATIONS)
    if isinstance(action_space, gymnasium.spaces.Box):
        groups.append(_CONTINUOUS_ACTIONS)
    values = {}
    for group in groups:  # a group's values were measured together: all of it, or none
        if not named.keys() & group.keys():
            values.update(group)
    return values
