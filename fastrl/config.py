"""Every option of fastrl in one dataclass, the command line built from it, and
the checks that refuse an impossible configuration before any process starts.

Each field carries its help text where it is declared, and whether it is one of the
options most runs touch, which `--help` lists; `--help_all` lists every one.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from fastrl.envs.doom.scenarios import ENGINE_RECYCLE_EPISODES as DOOM_ENGINE_RECYCLE_EPISODES
from fastrl.plumbing.files import cannot_write, write_json
from fastrl.plumbing.seeding import SEED_BITS


def splits_per_worker(inference: str, num_policies: int, agents_per_game: int = 1) -> int:
    """Env groups per rollout worker: two alternate with a policy worker, one with local inference
    (which cannot overlap acting with stepping), at least one per policy. With A learning agents a
    game, agent a is in split a of a group of A that step together, since a game moves only when all
    its agents have acted. A function so that the planner can weigh layouts before any Config exists."""
    if agents_per_game > 1:
        groups = max(2 if inference == "policy_worker" else 1, -(-num_policies // agents_per_game))
        return agents_per_game * groups
    return max(2 if inference == "policy_worker" else 1, num_policies)


class ConfigError(ValueError):
    """A configuration a run can never succeed with; the message says how to fix it."""


# --device's and --inference's values; a saved plan.json names one of each too.
DEVICES = ("auto", "cpu", "cuda")
INFERENCE_MODES = ("local", "policy_worker")

# The heading the Config fields declared next are listed under (`_section`).
_SECTION = [""]


def _section(title: str) -> None:
    """Open a group of Config fields: `--help`, `--help_all` and docs/options.md list
    the fields declared after it, up to the next `_section`, under this title."""
    _SECTION[0] = title


def _opt(default, help: str, *, common: bool = False, why: str = "", **extra):
    """A Config field and its command-line option. help: what it does, in 25 words at
    most. common: listed by `--help`, which keeps to the options most runs touch;
    `--help_all` lists every one. why: the reason behind the default or the design,
    in a sentence or two, for docs/options.md only."""
    return field(default=default, metadata={"help": help, "common": common, "why": why, "section": _SECTION[0],
                                            **extra})


@dataclass
class Config:
    _section("what to train and where it goes")
    env: str = _opt("", "Environment: a fastrl name (doom_battle, ...), a gymnasium id (CartPole-v1), a name from "
                        "fastrl.register_env, or module:name. Doom, Atari and continuous-action envs bring defaults.",
                    common=True,
                    why="Such a family replaces the defaults of the options you do not set (fastrl/presets.py); an "
                        "option you give always wins. docs/envs.md lists the names and what each brings, and how to "
                        "register your own; module:name imports the module, which registers name.")
    env_option: str = _opt("", "An option of an env registered with fastrl.register_env, as key=value; repeat the flag, "
                               "or separate pairs with commas.", repeatable=True,
                           why="The env declares each option with its default and help (docs/envs.md). Values are "
                               "checked before any process starts and saved in config.json, so a resume and "
                               "fastrl.enjoy make the same env.")
    modules: str = _opt("", "Python modules or .py files to import first, comma separated: those registering your envs "
                            "and models. Filled in when a script registers them.",
                        why="Every process of a run, and fastrl.enjoy, imports them before it looks up --env and "
                            "--model; a script that registers its own env or model is recorded here by itself "
                            "(docs/envs.md).")
    experiment: str = _opt("", "Experiment name; the run lives in <train_dir>/<experiment>/. Defaults to the env name.",
                           common=True)
    train_dir: str = _opt("train_dir", "Root folder for experiments (config.json, checkpoints, summary.json).", common=True)
    restart: bool = _opt(False, "Start from scratch even if the experiment folder holds checkpoints (they are deleted).",
                         common=True)
    seed: int = _opt(0, "Seed of everything random: the initial weights, the envs' episodes and every process's sampling "
                        "(fastrl/plumbing/seeding.py).", common=True)
    device: str = _opt("auto", "Where the learner and policy workers compute: auto (where CUDA is present, the faster by "
                       "the plan's prediction; cuda under --plan off), cpu or cuda.",
                       choices=DEVICES, common=True)

    _section("when to stop")
    train_for_env_frames: int = _opt(0, "Stop after this many env frames (agent steps x frameskip); 0 = no limit.",
                                     common=True)
    train_for_seconds: float = _opt(0.0, "Stop after this many seconds of wall time since the command started; "
                                         "0 = no limit.", common=True)
    stop_at_reward: Optional[float] = _opt(None, "Stop once the mean return of the last 100 episodes is at least this.",
                                           common=True)

    _section("processes")
    num_workers: int = _opt(1, "Rollout worker processes, each stepping its own envs (per rank under torchrun).",
                            common=True)
    num_envs_per_worker: int = _opt(32, "Envs per rollout worker. With policy workers they form two halves that "
                                        "alternate; with several policies, one group per policy.", common=True)
    inference: str = _opt(
        "local",
        "Where actions are computed: 'local', in each rollout worker for its own envs, or 'policy_worker', in separate "
        "processes that batch every worker's observations.",
        choices=INFERENCE_MODES,
        why="Local inference has no round trip between processes, which suits a machine with few CPU cores; policy "
            "workers batch many workers' observations into one forward, which pays with a GPU or many workers.",
    )
    num_policy_workers: int = _opt(1, "Policy-worker processes (only with --inference policy_worker).")
    torch_threads: int = _opt(1, "Torch threads in every process; on a machine with few cores more threads only steal "
                                 "time from other processes.")
    learner_threads: int = _opt(0, "Torch threads for the learner (0 = --torch_threads); worth more than one when the "
                                   "learner is the bottleneck and a core would otherwise idle.")
    num_buffers: int = _opt(0, "Trajectory buffers in shared memory (0 = one per env split, a batch per policy and "
                               "one more batch). Fewer throttle sampling and policy lag.",
                            why="With --max_batches_ahead set, 0 means the pool that bound needs. A pool too small "
                                "ever to fill a batch is refused before the run starts.")
    max_batches_ahead: int = _opt(
        -1, "Batches sampling may run ahead of training: -1 = no bound (asynchronous APPO); 0 = on-policy, sampling "
            "and learning take turns; 1 = one ahead.",
        why="0 is how PPO runs in SB3 or CleanRL (policy lag 0), and -1 frees a batch's buffers once the learner has "
            "copied them (lag 1-2 batches when the learner is the slower side). The bound is exact with --inference "
            "local and one policy; each policy worker's second env half keeps a buffer of its own, which may add up "
            "to 1 + workers / (buffers per batch) batches of lag.")
    plan: str = _opt("auto", "Process layout: 'auto' picks workers, envs, inference and threads by profiling this "
                             "machine and earlier runs; 'fresh' forgets those first; 'off'; or a plan.json.", common=True,
                     why="Options you set yourself are kept, and the plan is printed and saved with the run "
                         "(docs/how-it-works.md; benchmarks/plan_stability.py checks that it chooses alike each time).")
    worker_nice: int = _opt(0, "Niceness (0-19) of rollout workers and their envs' processes: higher shifts CPU from "
                               "the actors to the learner. --plan auto sets it.",
                            why="With more busy processes than cores, Linux shares the CPU by weight; the planner "
                                "picks the niceness that gives the learner the share its cost needs.")
    pin_workers: bool = _opt(False, "Run rollout worker i and its envs' processes on core i (round-robin), keeping "
                                    "each env step's hand-off between worker and engine on one core.",
                             why="The cores are those this process may use. Off by default: on a 2-core machine it made Doom sampling faster but training no "
                                 "faster, as the learner bounds training there (benchmarks/train_throughput.py with "
                                 "--pin_workers true and false).")
    adapt: bool = _opt(False, "While training, move a torch thread to or from the learner when rollout workers or the "
                              "learner wait.",
                       why="Off by default: on a loaded 2-core machine, a second learner thread cut training about "
                           "tenfold.")
    inference_batch_wait_ms: float = _opt(0.0, "Policy worker: how long to wait for more requests after the first "
                                               "before running the batch.")

    _section("several policies")
    num_policies: int = _opt(1, "Policies trained at once, each with its own learner process, weights and checkpoints; "
                                "every rollout worker gives each policy an equal share of its envs.",
                             why="Each policy's checkpoints go to <experiment>/checkpoints/policy_<k>. Every learner "
                                 "is a busy process, so on a machine with few cores each policy trains at a fraction "
                                 "of one policy's rate; the plan line says how many fit (docs/several-policies.md, "
                                 "benchmarks/several_policies.py).")
    with_pbt: bool = _opt(False, "Population-based training of the --num_policies policies: every "
                                 "--pbt_period_env_steps, the worst take the best ones' weights and hyperparameters, "
                                 "then perturb them.",
                          why="Policies are ranked by the mean return of their last 100 episodes, and lr, "
                              "entropy_coef, gamma and reward_scale are perturbed within bounds. Every change is "
                              "logged to <experiment>/pbt.jsonl and TensorBoard and replayed on resume "
                              "(benchmarks/several_policies.py).")
    pbt_period_env_steps: int = _opt(1_000_000, "Agent steps of each policy between two PBT rounds.")
    pbt_replace_fraction: float = _opt(0.3, "PBT: the fraction of policies replaced each round (at least one), and the "
                                            "fraction the replacements' sources are drawn from.")
    pbt_perturb_factor: float = _opt(1.2, "PBT: multiply or divide each perturbed hyperparameter by this (gamma: its "
                                          "horizon 1 / (1 - gamma)), within its bounds (fastrl/learning/pbt.py).")

    _section("algorithm (APPO)")
    rollout: int = _opt(32, "Steps per trajectory (T); V-trace runs over each trajectory.", common=True)
    batch_size: int = _opt(1024, "Samples (env steps) per learner batch, per rank under torchrun; a multiple of "
                                 "rollout x envs per split.", common=True,
                           why="Under torchrun each gradient step averages over ranks x this many samples.")
    ppo_epochs: int = _opt(2, "Passes over each batch; 4 on Atari and on MuJoCo's Hopper, Walker2d, Ant, "
                                 "Humanoid, 10 on Walker2d with a budget (fastrl/presets.py).")
    num_minibatches: int = _opt(4, "Gradient steps per pass; the batch is split evenly among them (see "
                                   "--minibatch_split).")
    minibatch_split: str = _opt(
        "trajectories",
        "How a pass splits the batch: 'samples' deals out single steps at random (continuous control's default), "
        "'trajectories' whole trajectories. GRU models always take trajectories.",
        choices=("samples", "trajectories"),
        why="'samples' is what SB3 and CleanRL do, so each minibatch sees many envs and moments, with V-trace's "
            "targets computed over whole trajectories once per batch; 'trajectories' takes consecutive steps of a few "
            "envs and recomputes the targets at each minibatch. A GRU's state needs the steps before.",
    )
    lr: float = _opt(2e-3, "Adam learning rate; 1e-3 (with --target_kl 0.01) for continuous actions; env presets set "
                           "others, e.g. 3e-4 on Hopper, Walker2d, Ant, Humanoid (fastrl/presets.py).", common=True,
                     why="2e-3 rather than 1e-3 because CartPole-v1 and LunarLander-v3 reach their target returns "
                         "sooner with it (benchmarks/cartpole_time_to_score.py, benchmarks/learning_suite.py).")
    adam_eps: float = _opt(1e-6, "Adam epsilon.")
    gamma: float = _opt(0.99, "Discount factor.", common=True)
    reward_scale: float = _opt(1.0, "Multiply rewards by this before learning (returns are reported unscaled); with "
                                    "--normalize_returns false it keeps the value targets near 1.")
    reward_clip: float = _opt(0.0, "Clip each scaled reward to [-this, this] before learning (0 = off); 1 keeps an "
                                   "Atari score's sign, as DQN does. Returns are reported unclipped.")
    rho_bar: float = _opt(1.0, "V-trace truncation of the importance weight for the value targets and policy "
                               "advantages.")
    c_bar: float = _opt(1.0, "V-trace truncation of the trace-cutting coefficients.")
    clip_ratio: float = _opt(0.2, "PPO clip range of the policy ratio.")
    value_coef: float = _opt(0.5, "Weight of the value loss.")
    value_clip: float = _opt(0.0, "PPO value clipping: the loss also takes the prediction clipped to within this of "
                                  "the acting policy's value, keeping the larger error (0 = off).",
                             why="In normalised units with --normalize_returns.")
    entropy_coef: float = _opt(0.003, "Weight of the entropy bonus.")
    max_grad_norm: float = _opt(4.0, "Clip the gradient's global norm to this (0 = no clipping).")
    target_kl: float = _opt(0.0, "End a batch's passes once a minibatch's approximate KL from the policy at the "
                                 "batch's start exceeds this (0 = off; 0.01 for continuous actions).",
                            why="The minibatch past the bound takes no step. It costs one forward of the batch without "
                                "gradients when a batch takes more than one step; it steadied Pendulum-v1 at a "
                                "larger step size (benchmarks/learning_suite.py).")
    normalize_advantages: bool = _opt(True, "Normalise advantages over each minibatch.")
    max_policy_lag: int = _opt(25, "Drop samples from a policy more than this many learner steps (batches trained) "
                                   "old; V-trace corrects the rest.",
                               why="A learner step is one policy version, ppo_epochs x num_minibatches optimiser "
                                   "steps, as Sample Factory counts its policy versions.")
    vtrace_lambda: float = _opt(1.0, "V-trace's lambda, trading the targets' variance for bias as GAE's does; 1 = the "
                                     "paper's V-trace, 0.95 for vector observations and Doom (fastrl/presets.py).",
                                why="It scales every trace coefficient; on-policy, V-trace with lambda is GAE(lambda) "
                                    "(benchmarks/learning_suite.py).")
    bootstrap_time_limits: bool = _opt(True, "At an episode cut by a time limit, add the discounted value of its last "
                                             "observation to the return, as if it went on.",
                                       why="False treats the cut as the episode's end, as Sample Factory does by "
                                           "default: right where the limit is part of the task (a Doom scenario's "
                                           "timeout ends the game).")
    normalize_returns: bool = _opt(True, "Train the value head on z-scores of the value targets (running statistics), "
                                         "so the value loss's scale does not depend on the rewards'.",
                                   why="On by default because a GRU core shared by the policy and the value saturates "
                                       "when asked for raw returns far from 1, and then stops carrying what the frame "
                                       "shows (tests/test_learns_to_see.py).")
    exploration_loss: str = _opt("entropy", "Exploration term weighted by --entropy_coef: 'entropy', a bonus, or "
                                            "'symmetric_kl', a penalty on the KL to and from uniform (discrete "
                                            "actions only).", choices=("entropy", "symmetric_kl"),
                                 why="An entropy bonus's pull fades as the policy turns deterministic; KL(p||uniform) "
                                     "+ KL(uniform||p) keeps pulling, which the Doom presets use (fastrl/presets.py).")
    lr_schedule: str = _opt("constant", "Learning rate over the run: 'constant', or 'linear', which decays --lr to 0 "
                                        "where the run's budget (frames or seconds) ends.",
                            choices=("constant", "linear"),
                            why="The nearer budget counts; a resumed run counts all its frames but only this "
                                "command's seconds; under torchrun only frames, as each rank keeps its own clock. "
                                "Not a default on its own: on MuJoCo's Hopper-v5 its runs fell back from their best "
                                "less but ended lower; Walker2d with a budget takes it in PPO's regime (docs/envs.md).")

    _section("model")
    model: str = _opt("", "The network's encoder: empty for fastrl's (MLP for vectors, conv for images), a name "
                          "registered with fastrl.register_model, or module:factory.",
                      why="fastrl keeps its GRU core, heads, action distributions, normalisers and --precision around "
                          "your encoder (docs/models.md).")
    hidden_sizes: str = _opt("64,64", "MLP encoder layer sizes for vector observations, comma separated.")
    activation: str = _opt("tanh", "MLP activation.", choices=("tanh", "relu", "elu"))
    encoder_init_gain: float = _opt(math.sqrt(2.0), "Orthogonal-init gain of the encoders' conv and linear layers "
                                                    "(Sample Factory uses 1).")
    policy_init_gain: float = _opt(0.01, "Orthogonal-init gain of the policy head: small starts the policy near "
                                         "uniform (Sample Factory uses 1).",
                                   why="On doom_defend_the_center, a policy head at gain 1 together with Sample "
                                       "Factory's loss settings got past the turn-and-fire plateau, where neither alone "
                                       "did, so the Doom presets set it (fastrl/presets.py, "
                                       "benchmarks/learning_suite.py).")
    log_std_init: float = _opt(0.0, "Continuous actions: the Gaussian's starting log standard deviation, in units "
                                    "of each bounded action's half-width; -1 for continuous control (fastrl/presets.py).",
                               why="A state-independent std, learned, as PPO's reference implementations use; -1 starts "
                                   "a [-1, 1] action at a std of 0.37 and a [-2, 2] one at 0.74.")
    use_rnn: bool = _opt(False, "Add a GRU core after the encoder.", common=True)
    conv_stack: str = _opt("fastrl", "Image encoders' conv layers: fastrl (32k8s4, 64k4s2, 128k3s2: coarse and cheap) "
                                     "or nature (the DQN paper's 32k8s4, 64k4s2, 64k3s1: finer cells).",
                           choices=("fastrl", "nature"))
    conv_activation: str = _opt("elu", "Activation after each of the image encoders' layers: elu (Sample Factory's) "
                                       "or relu (the DQN paper's, SB3's and CleanRL's).", choices=("elu", "relu"))
    rnn_size: int = _opt(512, "GRU hidden size.")
    normalize_obs: bool = _opt(False, "Running mean/std normalisation inside the model of vector observations and of "
                                      "each image pixel (on by default on Doom and continuous control: "
                                      "fastrl/presets.py).")
    precision: str = _opt("auto", "Arithmetic of image encoders: fp32, bf16 (bfloat16 convs and FC layers, the rest "
                                  "float32), or auto = whichever this machine's CPU or GPU runs faster.",
                          choices=("auto", "fp32", "bf16"),
                          why="bf16 halves the bytes a convolution moves, but only the hardware's kernels decide "
                              "whether it is faster, so auto times both for the actors and the learner apart and "
                              "caches the answer under ~/.cache/fastrl; a CPU without native bf16 gets fp32 unmeasured. "
                              "A saved auto is decided again where a run resumes or plays "
                              "(benchmarks/precision_parity.py).")
    compile_learner: str = _opt("auto", "torch.compile the learner's forward and backward: auto = on a CPU, for image "
                                        "models with a GRU, if timed faster than eager; on; off.",
                                choices=("auto", "on", "off"),
                                why="On a CPU the compile runs in the background while the learner trains eagerly; "
                                    "real steps are then timed both ways and the faster kept. On a GPU the compile "
                                    "stalls the learner for about 35 s and eager steps already outpace the CPU side, "
                                    "so auto stays eager there "
                                    "(benchmarks/train_throughput.py with --compile_learner auto and off).")
    compile_actors: str = _opt("auto", "torch.compile each local rollout worker's forward on a CPU: auto = for models "
                                       "the learner compiles, acting in fp32, if timed faster; on; off.",
                               choices=("auto", "on", "off"),
                               why="A worker acts eagerly for 30 s, then compiles in place and times forwards both "
                                   "ways. Policy workers and GPU inference never compile: their batch sizes change, "
                                   "and a GPU already acts through CUDA graphs (fastrl/sampling/compiled_act.py, "
                                   "benchmarks/train_throughput.py).")
    learner_allocator: str = _opt("caching", "Where a CPU learner's tensors of 1 MB or more come from: 'caching' keeps "
                                             "freed blocks for the next step; 'system' = torch's own allocator.",
                                  choices=("caching", "system"),
                                  why="Reused blocks spare the kernel zeroing fresh pages every step, which made "
                                      "doom_battle's training faster and its memory flat at its peak. The allocator "
                                      "(fastrl/plumbing/caching_allocator.py) is built with the machine's C++ compiler "
                                      "at first use (benchmarks/train_throughput.py).")
    separate_critic: bool = _opt(True, "Give the value function its own encoder (no GRU) instead of sharing the "
                                       "policy's; costs a second encoder pass, so image models may prefer false.")

    _section("env options")
    doom_scenario: str = _opt("", "Path to your own ViZDoom .cfg (with --env doom_custom or any doom_* env), run with "
                                  "fastrl's wrappers.")
    doom_measurements: bool = _opt(False, "Doom: add health, ammo, armor, kills and weapon as a second observation.")
    doom_hud: bool = _opt(False, "Doom: render the status bar (health, ammo, armor, weapons) below a smaller 3D view, "
                                 "as Sample Factory's Doom scenarios do.")
    doom_engine_recycle_episodes: int = _opt(
        DOOM_ENGINE_RECYCLE_EPISODES,
        "Doom: replace each ViZDoom engine process with a fresh one after this many episodes on it, keeping memory "
        "flat over long runs; 0 = never.",
        why="An engine's memory grows about 2 MB per million frames and a replacement takes about 0.13 s, so the "
            "default costs at most 1% of the engine's stepping time, on doom_basic's shortest episodes "
            "(benchmarks/experiments/doom_engine_memory.py).")
    doom_agents: int = _opt(0, "Doom deathmatch (doom_duel, doom_deathmatch): learning agents in each game, each "
                               "counting as one env of --num_envs_per_worker; 0 = the scenario's own.",
                            why="Each agent is a player of one network game on 127.0.0.1, the first hosting it. "
                                "Agent a of a game acts in env split a of its group, so with --num_policies 2 or more "
                                "agents of different policies play each other (docs/several-policies.md). The "
                                "scenario's own count is 2 in doom_duel and 1 in doom_deathmatch.")
    decorrelate_envs: bool = _opt(True, "Before its first recorded step, each env with a time limit takes a random "
                                        "number of random actions, so envs do not reset in lockstep.",
                                  why="Envs whose episodes always run to the limit (Pendulum's 200 steps, a MuJoCo "
                                      "task's 1000 once it stops falling) would otherwise fill every batch with one "
                                      "phase of their episodes. Those cut-into first episodes are left out of the "
                                      "return statistics; envs without a limit (Doom, Atari) start as they are.")
    atari_sticky_actions: bool = _opt(False, "Atari: repeat the previous action with probability 0.25 per frame "
                                             "(Machado et al. 2018).")
    atari_episodic_life: bool = _opt(True, "Atari: a lost life ends the learner's episode (the game goes on); "
                                           "full-game scores are the true objective.")

    _section("monitoring")
    with_wandb: bool = _opt(False, "Also log to Weights & Biases (TensorBoard files are always written under "
                                   "<experiment>/tb).", common=True)
    wandb_project: str = _opt("fastrl", "W&B project to log into.", common=True)
    wandb_entity: str = _opt("", "W&B user or team that owns the project (empty = your default entity).")
    wandb_group: str = _opt("", "W&B group, to show several runs of one study together (empty = none).")
    wandb_tags: str = _opt("", "W&B tags, comma separated, like cartpole,baseline.")

    _section("evaluation")
    eval_every_frames: int = _opt(0, "Every this many env frames, play --eval_episodes deterministic episodes in a "
                                     "separate process, report eval/return and keep the best checkpoint; 0 = off.",
                                  common=True)
    eval_episodes: int = _opt(5, "Episodes per evaluation (its cost: this many episodes per --eval_every_frames "
                                 "frames).", common=True)

    _section("past one machine (torchrun)")
    dist_backend: str = _opt("auto", "Under torchrun, how the learners all-reduce gradients: gloo (CPU tensors), nccl "
                                     "(CUDA tensors), or auto = nccl when the learner is on CUDA, else gloo.",
                             choices=("auto", "gloo", "nccl"),
                             why="gloo works over any network; without torchrun the option is ignored "
                                 "(docs/scale-out.md).")
    dist_timeout_seconds: float = _opt(60.0, "Under torchrun, seconds a learner waits for the other ranks in a "
                                             "collective before stopping the run; keep it well above any rank's batch "
                                             "time.",
                                       why="A dead rank is noticed at once, as its connections close; a hung one only "
                                           "after this long. Ranks wait for each other's batches every step, so the "
                                           "slowest rank's time to fill a batch and to start must fit in it.")

    _section("checkpoints, status lines and restarts")
    checkpoint_every_seconds: float = _opt(120.0, "Seconds between periodic checkpoints (one is always written at "
                                                  "exit).", common=True)
    keep_checkpoints: int = _opt(3, "How many of the newest checkpoints to keep.")
    status_every_seconds: float = _opt(5.0, "Seconds between console status lines.", common=True)
    worker_timeout_seconds: float = _opt(60.0, "A worker, learner (or 10 of its steps) or queue-lock holder silent "
                                               "this long is killed; workers restart.",
                                         why="A restarted rollout worker gets fresh envs. A lock held that long means its holder hung inside a queue call, which "
                                             "would stall every process using that queue.")
    max_worker_restarts: int = _opt(5, "A worker killed or hung more often than this within 10 minutes stops the run, "
                                       "named with its cause, instead of being restarted again.",
                                    why="A worker that keeps dying has a cause to fix, which endless restarts would "
                                        "hide (benchmarks/chaos.py raises it to survive its own kills).")
    max_restarts: int = _opt(0, "When the learner dies, restart the whole run from the newest good checkpoint instead "
                                "of stopping, at most this many times; 0 = stop.",
                             why="Frames and counters go on from the checkpoint's. Training since it is lost, so a "
                                 "shorter --checkpoint_every_seconds loses less.")
    max_bad_batches: int = _opt(20, "Batches holding NaN or inf observations or rewards are dropped; this many in a row "
                                    "are tolerated, one more stops the run naming the env.",
                                why="Dropped before the learner or its normaliser sees them, and counted on the status "
                                    "line and in TensorBoard (data/bad_batches_dropped).")

    @property
    def experiment_dir(self) -> str:
        return os.path.join(self.train_dir, self.experiment or self.env)

    @property
    def agents_per_game(self) -> int:
        """Learning agents in each of the env's games (--doom_agents); 1 for every env
        that is not a deathmatch scenario."""
        if self.doom_agents:
            return self.doom_agents
        from fastrl.envs.doom.scenarios import SCENARIOS

        scenario = SCENARIOS.get(self.env)
        return scenario.agents if scenario is not None else 1

    @property
    def num_splits(self) -> int:
        """Env groups per worker (splits_per_worker)."""
        return splits_per_worker(self.inference, self.num_policies, self.agents_per_game)

    def policy_of_split(self, split: int) -> int:
        """The policy that acts in a worker's env split (the same in every worker)."""
        return split % self.num_policies

    @property
    def envs_per_split(self) -> int:
        return self.num_envs_per_worker // self.num_splits

    @property
    def samples_per_buffer(self) -> int:
        return self.rollout * self.envs_per_split

    @property
    def buffers_per_batch(self) -> int:
        return self.batch_size // self.samples_per_buffer

    @property
    def total_buffers(self) -> int:
        if self.num_buffers:
            return self.num_buffers
        if self.max_batches_ahead >= 0:
            # A worker blocked for a buffer holds its other splits' ones (see validate).
            return self.num_workers * (self.num_splits - 1) + (self.max_batches_ahead + 1) * self.num_policies * self.buffers_per_batch
        return self.num_workers * self.num_splits + (self.num_policies + 1) * self.buffers_per_batch

    @property
    def frees_after_training(self) -> bool:
        """Whether the learner keeps a batch's buffers until it has trained on it
        (--max_batches_ahead), rather than freeing them once copied."""
        return self.max_batches_ahead >= 0

    @property
    def minibatches_of_samples(self) -> bool:
        """Whether a pass's minibatches are single samples (--minibatch_split samples):
        a GRU model always takes whole trajectories, and one minibatch is the whole
        batch, trained in place."""
        return self.minibatch_split == "samples" and not self.use_rnn and self.num_minibatches > 1

    @property
    def hidden_size_tuple(self) -> tuple:
        return tuple(int(s) for s in self.hidden_sizes.split(",") if s.strip())

    def budget_done(self, run_frames: int, seconds: float) -> dict:
        """How far `run_frames` and `seconds` are through each budget set: {"frames": f,
        "seconds": s}, fractions that pass 1 past it; empty when the run has no budget."""
        done = {}
        if self.train_for_env_frames:
            done["frames"] = run_frames / self.train_for_env_frames
        if self.train_for_seconds:
            done["seconds"] = seconds / self.train_for_seconds
        return done

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __setstate__(self, state: dict) -> None:
        # A Config reaches each child process pickled: importing its --modules there first
        # registers the run's own env and model before anything looks them up.
        self.__dict__.update(state)
        import_modules(self)


def validate(cfg: Config, writes: bool = True) -> None:
    """Raise ConfigError naming the first impossible setting and how to fix it. `writes`: whether
    to try writing the experiment folder (not on torchrun ranks past 0, which would race rank 0)."""
    if not cfg.env:
        raise ConfigError("No environment given: pass --env, for example --env CartPole-v1 or --env doom_battle.")
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{f.name} is {value} but must be a finite number.")
    if not 0 <= cfg.seed < 2**SEED_BITS:
        raise ConfigError(f"--seed is {cfg.seed} but must lie in [0, {2**SEED_BITS - 1}], "
                          "the seeds every env takes (some hand theirs to a C engine).")
    for name in ("num_workers", "num_envs_per_worker", "num_policy_workers", "num_policies", "pbt_period_env_steps",
                 "torch_threads", "rollout", "batch_size", "ppo_epochs", "num_minibatches", "keep_checkpoints", "rnn_size", "eval_episodes"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"--{name} is {getattr(cfg, name)} but must be a positive whole number.")
    for name in ("lr", "status_every_seconds", "checkpoint_every_seconds", "encoder_init_gain", "policy_init_gain",
                 "dist_timeout_seconds"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"--{name} is {getattr(cfg, name)} but must be positive.")
    for name in ("train_for_env_frames", "train_for_seconds", "num_buffers", "max_grad_norm", "reward_clip", "entropy_coef", "learner_threads", "value_clip",
                 "target_kl",
                 "inference_batch_wait_ms", "max_policy_lag", "eval_every_frames", "max_worker_restarts", "max_restarts", "max_bad_batches",
                 "doom_engine_recycle_episodes", "doom_agents"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name} is {getattr(cfg, name)} but must not be negative.")
    if not 0 <= cfg.worker_nice <= 19:
        raise ConfigError(f"--worker_nice is {cfg.worker_nice} but Linux niceness lies in 0-19 (0 = the learner's own).")
    if not 0.0 <= cfg.gamma <= 1.0:
        raise ConfigError(f"--gamma is {cfg.gamma} but must lie in [0, 1].")
    if not 0.0 <= cfg.vtrace_lambda <= 1.0:
        raise ConfigError(f"--vtrace_lambda is {cfg.vtrace_lambda} but must lie in [0, 1].")
    if cfg.lr_schedule == "linear" and not (cfg.train_for_env_frames or cfg.train_for_seconds):
        raise ConfigError("--lr_schedule linear decays the learning rate to 0 where the run's budget ends; set "
                          "--train_for_env_frames or --train_for_seconds, or choose --lr_schedule constant.")
    try:
        sizes = cfg.hidden_size_tuple
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) <= 0:
        raise ConfigError(f"--hidden_sizes '{cfg.hidden_sizes}' must be positive whole numbers separated by commas, like 64,64.")
    if cfg.with_pbt and cfg.num_policies < 2:
        raise ConfigError(f"--with_pbt true needs a population: --num_policies {cfg.num_policies} trains one; "
                          "pass --num_policies 4, say.")
    if not 0.0 < cfg.pbt_replace_fraction <= 0.5:
        raise ConfigError(f"--pbt_replace_fraction is {cfg.pbt_replace_fraction} but must lie in (0, 0.5]: "
                          "the policies replaced and those copied from must not overlap.")
    if cfg.pbt_perturb_factor <= 1.0:
        raise ConfigError(f"--pbt_perturb_factor is {cfg.pbt_perturb_factor} but must be above 1, like 1.2.")
    if cfg.num_envs_per_worker % cfg.num_splits:
        groups = f"--num_envs_per_worker {cfg.num_envs_per_worker} must be a multiple of the {cfg.num_splits} env groups"
        fits = max(cfg.num_splits, cfg.num_envs_per_worker // cfg.num_splits * cfg.num_splits)
        if cfg.agents_per_game > 1:
            raise ConfigError(
                f"{groups} each worker has with {cfg.agents_per_game} agents in each game of {cfg.env} "
                f"(one per agent{', in two alternating sets' if cfg.inference == 'policy_worker' else ''}); use {fits}.")
        if cfg.num_policies > 1:
            raise ConfigError(f"{groups} each worker has with --num_policies {cfg.num_policies} (one per policy); "
                              f"use {fits}.")
        raise ConfigError(
            f"--num_envs_per_worker {cfg.num_envs_per_worker} must be even with --inference policy_worker, "
            "because each worker's envs are split in two halves that alternate."
        )
    per_buffer = cfg.samples_per_buffer
    if cfg.batch_size % per_buffer:
        lower = max(per_buffer, cfg.batch_size // per_buffer * per_buffer)
        raise ConfigError(
            f"--batch_size {cfg.batch_size} is not a multiple of rollout x envs per split = "
            f"{cfg.rollout} x {cfg.envs_per_split} = {per_buffer}; use {lower} or {lower + per_buffer}."
        )
    columns = cfg.batch_size // cfg.rollout  # env trajectories in a batch; minibatches split them
    if columns % cfg.num_minibatches:
        raise ConfigError(
            f"--num_minibatches {cfg.num_minibatches} must divide the {columns} trajectories of a batch "
            f"(batch_size / rollout); pick a divisor of {columns}."
        )
    if cfg.compile_learner == "on" and cfg.minibatches_of_samples:
        raise ConfigError("--compile_learner on compiles the re-run of whole trajectories, which "
                          "--minibatch_split samples does not use; pass --minibatch_split trajectories or "
                          "--compile_learner off.")
    if cfg.max_batches_ahead < -1:
        raise ConfigError(f"--max_batches_ahead is {cfg.max_batches_ahead} but must be -1 (no bound), 0 (on-policy) or more.")
    # A learner may hold all but one buffer of its batch while it waits for the last, so the pool needs
    # a batch per policy beyond the splits' buffers. A learner that frees buffers only after training
    # holds none while it waits, and a waiting worker has handed its finished one over: a split fewer.
    splits_holding = cfg.num_splits - 1 if cfg.frees_after_training else cfg.num_splits
    need = cfg.num_workers * splits_holding + cfg.num_policies * cfg.buffers_per_batch
    if cfg.num_buffers and cfg.num_buffers < need:
        learners = "a batch" if cfg.num_policies == 1 else f"each of the {cfg.num_policies} policies' batches"
        holding = "every worker split holds" if splits_holding == cfg.num_splits else "every worker's other splits hold"
        raise ConfigError(
            f"--num_buffers {cfg.num_buffers} can never fill a batch: {holding} one buffer while it samples "
            f"and {learners} needs {cfg.buffers_per_batch} more; use at least {need}."
        )
    if cfg.device == "cuda" or cfg.dist_backend == "nccl":
        import torch

        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for but torch sees no CUDA device; use --device auto or cpu.")
        if cfg.dist_backend == "nccl" and (cfg.device == "cpu" or not torch.cuda.is_available()):
            raise ConfigError("--dist_backend nccl all-reduces CUDA tensors, but this run's learner computes on the CPU; "
                              "use --dist_backend gloo or auto.")
    if cfg.plan not in ("auto", "fresh", "off") and not os.path.isfile(cfg.plan):
        raise ConfigError(f"--plan {cfg.plan} is neither auto, fresh, off nor a plan.json file; check the path.")
    if cfg.doom_scenario and not os.path.isfile(cfg.doom_scenario):
        raise ConfigError(f"--doom_scenario {cfg.doom_scenario} is not a file; give the path to a ViZDoom .cfg.")
    if os.path.isabs(cfg.experiment) or os.path.normpath(cfg.experiment).split(os.sep)[0] == os.pardir:
        raise ConfigError(f"--experiment {cfg.experiment} leads out of --train_dir {cfg.train_dir}, where a --restart "
                          "would delete another folder's checkpoints; give a name inside it, or set --train_dir.")
    reason = cannot_write(cfg.experiment_dir, folder=True) if writes else None
    if reason:
        raise ConfigError(f"The experiment folder {cfg.experiment_dir} cannot be written ({reason}); "
                          "choose another --train_dir or --experiment.")


def check_env_and_options(cfg: Config, writes: bool = True):
    """validate() plus the env name and its options and the model, without importing torch; returns
    the EnvSpec. An env ignores other families' options, so a --doom_* or --atari_* one for it is
    refused here. Records in cfg.modules the modules that registered the env and model here, so that
    config.json leads fastrl.enjoy and a resume to them."""
    validate(cfg, writes)
    from fastrl.algo.model_registry import ModelError, model_builder, model_origin
    from fastrl.envs.registry import EnvOptionError, UnknownEnvError, get_spec

    import_modules(cfg)
    try:
        spec = get_spec(cfg.env)
    except UnknownEnvError as err:
        raise ConfigError(str(err)) from None
    for option in _family_options(cfg):
        family = option.split("_")[0]
        if not cfg.env.startswith(f"{family}_"):
            raise ConfigError(f"--{option} applies to {family}_* envs only, and {cfg.env} is not one; drop it.")
    if cfg.doom_agents and spec.make_match is None:
        raise ConfigError(f"--doom_agents applies to the Doom deathmatch scenarios only (doom_duel, doom_deathmatch), "
                          f"and {cfg.env} is not one; drop it.")
    try:
        spec.read_options(env_option_values(cfg))
    except EnvOptionError as err:
        raise ConfigError(f"--env_option: {err}") from None
    if cfg.model:
        try:
            model_builder(cfg.model)
        except ModelError as err:
            raise ConfigError(str(err)) from None
    _record_modules(cfg, {f"env {cfg.env}": spec.origin, f"model {cfg.model}": model_origin(cfg.model)})
    return spec


def module_list(text) -> list:
    """The comma-separated entries of an option such as --modules or --env_option."""
    return [m.strip() for m in str(text or "").split(",") if m.strip()]


def import_modules(cfg: Config) -> None:
    """Import cfg.modules, the user's modules that register envs and models; one that cannot be
    imported is a ConfigError."""
    from fastrl.envs.registry import import_user_module

    for reference in module_list(cfg.modules):
        try:
            import_user_module(reference)
        except ImportError as err:
            raise ConfigError(f"--modules: {err}") from None


def _record_modules(cfg: Config, origins: dict) -> None:
    """Add to cfg.modules each module in `origins` ({what: module that registered it, or ""}) as
    other processes import it."""
    from fastrl.envs.registry import module_reference

    modules = module_list(cfg.modules)
    for what, origin in origins.items():
        if not origin:
            continue
        reference = module_reference(origin)
        if not reference:
            raise ConfigError(f"The {what} was registered in an interactive interpreter, which fastrl's worker "
                              "processes cannot import; register it in a module or a script file.")
        if not any(m == reference or (m.endswith(".py") and os.path.realpath(m) == reference) for m in modules):
            modules.append(reference)
    cfg.modules = ",".join(modules)


def env_failure(name: str, err: Exception) -> str:
    """The sentence for an env that could not be made: its cause is the env's, so the user needs
    what it said, not a traceback through fastrl."""
    from fastrl.envs.registry import describe_error

    return f"The env {name} could not be made ({describe_error(err)})."


def env_options(cfg: Config) -> dict:
    """The env options (fastrl.envs.registry) this config asks for; every env of a run gets them:
    those of fastrl's families, and --env_option's, which the env reads as it declared them."""
    return {**_family_options(cfg), **env_option_values(cfg)}


def env_option_values(cfg: Config) -> dict:
    """--env_option's pairs as {key: value text}, the last of a repeated key winning."""
    values = {}
    for pair in module_list(cfg.env_option):
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"--env_option {pair!r} must be key=value, like size=7.")
        values[key.strip()] = value.strip()
    return values


def _family_options(cfg: Config) -> dict:
    """The options of fastrl's own env families (doom_*, atari_*) this config sets."""
    options = {}
    if cfg.doom_scenario:
        options["doom_scenario"] = cfg.doom_scenario
    if cfg.doom_measurements:
        options["doom_measurements"] = True
    if cfg.doom_hud:
        options["doom_hud"] = True
    # Passed only when not the env's default, so that the family check can refuse it for other envs.
    if cfg.doom_engine_recycle_episodes != DOOM_ENGINE_RECYCLE_EPISODES:
        options["doom_engine_recycle_episodes"] = cfg.doom_engine_recycle_episodes
    if cfg.atari_sticky_actions:
        options["atari_sticky_actions"] = True
    if not cfg.atari_episodic_life:
        options["atari_episodic_life"] = False
    return options


def _str2bool(text: str) -> bool:
    low = str(text).lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _optional_float(text: str) -> Optional[float]:
    return None if str(text).lower() in ("none", "") else float(text)


class _Repeated(argparse.Action):
    """A text option that may be given more than once (--env_option): its values join with commas."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, "")
        setattr(namespace, self.dest, f"{before},{values}" if before else values)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, "<name>: error: <message>", under the name
    the command's other errors use, instead of a usage block and then the error."""

    def __init__(self, *args, error_name: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.error_name = error_name

    def error(self, message: str):  # noqa: D401 - argparse hook
        self.exit(2, f"{self.error_name}: error: {message}\n")


TRAIN_DESCRIPTION = ("Train an agent with asynchronous APPO, or resume its experiment from the newest checkpoint. "
                     "Under `torchrun --nproc_per_node N` it runs N ranks whose learners average their gradients "
                     "(docs/scale-out.md).")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, except an empty one (--env, --experiment)."""

    def _get_help_string(self, action):
        return action.help if action.default == "" else super()._get_help_string(action)


HELP_ALL_EPILOG = "docs/options.md gives every option's default, meaning and the reasons behind it."


class _HelpAll(argparse.Action):
    """--help_all: the help with every option, where --help shows the common ones."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        for action in parser._actions:
            action.help = getattr(action, "full_help", action.help)
        parser.epilog = HELP_ALL_EPILOG
        parser.print_help()
        parser.exit()


def build_parser(prog: str = "python -m fastrl.train", description: str = TRAIN_DESCRIPTION,
                 error_name: str = "fastrl") -> argparse.ArgumentParser:
    """Every Config field as an option, in one group per `_section`. `--help` shows
    the common ones (`_opt(..., common=True)`); the others parse all the same, and
    `--help_all` shows them too."""
    fields = dataclasses.fields(Config)
    shown = sum(f.metadata["common"] for f in fields)
    parser = OneLineParser(prog=prog, description=description, allow_abbrev=False, error_name=error_name,
                           usage="%(prog)s --env ENV [options]",
                           epilog=f"Shown: the {shown} options most runs touch. --help_all lists all {len(fields)}; "
                                  + HELP_ALL_EPILOG,
                           formatter_class=_HelpFormatter)
    parser.add_argument("--help_all", action=_HelpAll, help="Show every option, not only the common ones, and exit.")
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="Options from a YAML or JSON file (a run's config.json too); the command line overrides it.")
    groups = {}
    for f in fields:
        meta = f.metadata
        if meta["section"] not in groups:
            groups[meta["section"]] = parser.add_argument_group(meta["section"])
        # argparse formats help with %-interpolation (%(default)s), so a literal % must be doubled.
        kwargs = {"default": f.default, "help": meta["help"].replace("%", "%%"), "dest": f.name}
        if f.type in ("bool", bool):
            kwargs.update(type=_str2bool, nargs="?", const=True, metavar="BOOL")
        elif f.type in ("int", int):
            kwargs.update(type=int, metavar="N")
        elif f.type in ("float", float):
            kwargs.update(type=float, metavar="X")
        elif f.type in ("Optional[float]",):
            kwargs.update(type=_optional_float, metavar="X")
        else:
            kwargs["type"] = str
            if meta.get("repeatable"):
                kwargs["action"] = _Repeated
        if "choices" in meta:
            kwargs["choices"] = meta["choices"]
        action = groups[meta["section"]].add_argument(f"--{f.name}", **kwargs)
        if not meta["common"]:
            action.full_help, action.help = action.help, argparse.SUPPRESS
    return parser


def options_markdown() -> str:
    """docs/options.md: every option's default, help and reason, a table per section
    (`python -m fastrl.config --markdown`; tests/test_options.py keeps the page equal to it)."""
    def cell(text: str) -> str:  # a "|" would end the cell, a "<" open an HTML tag
        return text.replace("|", "\\|").replace("<", "&lt;")

    def default(value) -> str:
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        return '`""`' if value == "" else f"`{value}`"

    fields = dataclasses.fields(Config)
    out = ["# Options of fastrl.train", "",
           "Generated from `fastrl/config.py` by `python -m fastrl.config --markdown > docs/options.md`: edit the "
           "texts there, then regenerate. `python -m fastrl.bench` takes every option too.", "",
           f"The {sum(f.metadata['common'] for f in fields)} options in bold are those most runs touch, which "
           f"`python -m fastrl.train --help` lists; `--help_all` lists all {len(fields)}. \"Why\" gives the reason "
           "behind a default or a design, and the benchmark that measures it where there is one."]
    for section in dict.fromkeys(f.metadata["section"] for f in fields):
        out += ["", f"## {section[0].upper()}{section[1:]}", "", "| option | default | meaning | why |",
                "| --- | --- | --- | --- |"]
        for f in (f for f in fields if f.metadata["section"] == section):
            meta = f.metadata
            name = f"`--{f.name}" + (f" {{{','.join(meta['choices'])}}}`" if "choices" in meta else "`")
            name = f"**{name}**" if meta["common"] else name
            out.append(f"| {name} | {default(f.default)} | {cell(meta['help'])} | {cell(meta['why'])} |")
    return "\n".join(out) + "\n"


def parse_args(argv=None, parser: Optional[argparse.ArgumentParser] = None) -> tuple:
    """Parse argv into (Config, extra namespace); unknown options exit 2 with a suggestion."""
    parser = parser or build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    options = [u for u in unknown if u.startswith("--")]
    if unknown:
        bad = (options or unknown)[0]
        flag = bad.split("=")[0]
        if flag.startswith("--") and flag[2:] in RETIRED_OPTIONS:
            parser.error(f"{flag} was removed ({RETIRED_OPTIONS[flag[2:]]}); drop it.")
        known = [a for action in parser._actions for a in action.option_strings]
        guess = difflib.get_close_matches(flag, known, n=1)
        hint = f" Did you mean {guess[0]}?" if guess else " Run with --help_all to list every option."
        parser.error(f"unknown option {bad}.{hint}")
    names = {f.name for f in dataclasses.fields(Config)}
    explicit = _explicit_options(argv, parser) & names
    values = {k: v for k, v in vars(args).items() if k in names}
    if getattr(args, "config", None):
        from_file = read_config_file(args.config, parser)
        values.update({k: v for k, v in from_file.items() if k not in explicit})
        explicit |= set(from_file)
    from fastrl.presets import preset_for

    values.update({k: v for k, v in preset_for(values["env"]).items() if k not in explicit})
    cfg = Config(**values)
    extra = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in names})
    extra.explicit = explicit  # the options the user gave; planners and presets keep them
    return cfg, extra


def _option_text(value) -> str:
    """A config file's value as the command line would spell it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict):  # env_option: {size: 7} in a YAML file
        return ",".join(f"{k}={_option_text(v)}" for k, v in value.items())
    return str(value)


def read_config_file(path: str, parser: argparse.ArgumentParser) -> dict:
    """{option: value} of a YAML or JSON file of options, each read as its command-line
    flag would be; a file that is not one, or names an unknown option, ends in one
    sentence (parser.error). A run's config.json reads back, its "origins" skipped."""
    import yaml  # JSON is YAML too, so one reader takes both

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as err:
        parser.error(f"--config {path} cannot be read ({err.strerror}); give a YAML or JSON file of options.")
    except yaml.YAMLError as err:
        parser.error(f"--config {path} is not YAML or JSON ({str(err).splitlines()[0]}); fix the file.")
    data = {} if data is None else data
    if not isinstance(data, dict):
        parser.error(f"--config {path} holds a {type(data).__name__}, not a mapping of option: value.")
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    names = {f.name for f in dataclasses.fields(Config)}
    values = {}
    for key, value in data.items():
        if key == "origins":
            continue
        if key not in names:
            guess = difflib.get_close_matches(str(key), sorted(names), n=1)
            hint = f" Did you mean {guess[0]}?" if guess else " python -m fastrl.train --help_all lists them."
            parser.error(f"--config {path} names an unknown option '{key}'.{hint}")
        action = actions[key]
        try:
            values[key] = value if value is None or action.type is None else action.type(_option_text(value))
        except (ValueError, argparse.ArgumentTypeError) as err:
            parser.error(f"--config {path}: {key}: {value!r} is not a valid value ({err}).")
        if action.choices and values[key] not in action.choices:
            parser.error(f"--config {path}: {key}: {value!r} is not one of {', '.join(action.choices)}.")
    return values


def _explicit_options(argv: list, parser: argparse.ArgumentParser) -> set:
    flags = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    return {flags[token.split("=", 1)[0]] for token in argv if token.split("=", 1)[0] in flags}


def save_config(cfg: Config, path: str, origins: Optional[dict] = None) -> None:
    """config.json: every option's value, and under "origins" where each value that
    is not its default came from (readers of the options skip it)."""
    write_json(path, {**cfg.to_dict(), **({"origins": origins} if origins is not None else {})}, indent=2,
               sort_keys=True)


def describe_origins(cfg: Config, origins: dict) -> str:
    """The values that differ from their defaults, grouped by where they came from."""
    by_source: dict = {}
    for name, source in origins.items():
        if name != "env":
            by_source.setdefault(source, []).append(f"{name}={getattr(cfg, name)}")
    return "; ".join(f"{source}: {', '.join(values)}" for source, values in by_source.items())


# Options whose default has changed, with the value every version before the change
# used. A config saved before it lacks the option, and means that value: read with
# today's default, an older experiment would build a model its checkpoints do not fit.
EARLIER_DEFAULTS = {"normalize_returns": False}

# Options deleted because they did not pay on benchmarks/learning_suite.py's envs: a command line
# naming one gets its sentence rather than a guess at a similar option.
RETIRED_OPTIONS = {
    "clip_anchor": "the PPO clip measures each step from the acting policy, as --clip_anchor behaviour did; "
                   "'proximal' did not learn better",
    "lr_kl_target": "it steered --lr_schedule kl_adaptive, which did not learn better and is gone too",
}
# Removed values of kept options, with the value a saved config's becomes: fastrl.enjoy plays the
# trained weights, which no learning-rate schedule changes, so mapping beats refusing to play.
RETIRED_VALUES = {"lr_schedule": {"kl_adaptive": "constant"}}


def config_from_saved(saved: dict) -> Config:
    """The Config a saved config (config.json, a checkpoint's "config") was trained with, its --modules
    imported. Options this version no longer knows are dropped, as they cannot change the model it builds."""
    known = {f.name for f in dataclasses.fields(Config)}
    values = {**EARLIER_DEFAULTS, **{k: v for k, v in saved.items() if k in known}}
    for name, replacements in RETIRED_VALUES.items():
        if values.get(name) in replacements:
            values[name] = replacements[values[name]]
    cfg = Config(**values)
    import_modules(cfg)  # the run's own env and model, for whoever plays or resumes it
    return cfg


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m fastrl.config --markdown > docs/options.md")
    sys.stdout.write(options_markdown())
