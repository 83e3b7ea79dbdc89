"""The actor-critic network and the observation layout it shares with the plumbing.

Observations always travel as a dict {key: tensor}: a plain Box or Discrete space is
the single key "obs", a gymnasium Dict space keeps its own keys. `obs_layout` fixes
each key's per-sample shape and storage dtype once, so shared-memory buffers can be
allocated before any env runs; `obs_to_tensors` converts one raw env observation to
that layout on the rollout worker's hot path.

Images are stored as uint8 [C, H, W] and only become float inside the model: a
quarter of the shared memory and copy bandwidth of float32, which matters more than
the cost of one conversion inside the batched forward pass.

Two entry points serve the two callers. `act` is one inference step for a policy
worker. `evaluate` is the learner's unroll over a [T+1, B] trajectory; without an RNN
it flattens time into the batch, with one it runs the encoders batched and loops only
the GRU cell over time (its input projection batched over all steps, the loop in
`gru_sequence`, which differentiates it by hand), resetting the state where an
episode begins. Inference and learner unroll share `_encode` and the GRU's
arithmetic (`gru_step`'s), so they agree (and the tests check that they do).

`build_model` makes the network a run's config asks for, in the arithmetic its
caller's role was given (`Precision`, which fastrl.tuning.precision decides);
`resolve_device` decides `--device auto`.
"""

import copy
import math
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fastrl.algo.distributions import ActionSpec
from fastrl.algo.gru_sequence import gru_sequence

ObsLayout = Dict[str, Tuple[Tuple[int, ...], torch.dtype]]

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
NORM_CLIP = 10.0
NORM_EPS = 1e-8
IMAGE_NORM_ROWS = 256  # frames per learner step that update per-pixel image statistics
CONV_MIN_SIZE = 36  # smallest H and W every conv stack (CONV_STACKS) accepts


def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def _leaf_layout(key: str, space: gym.Space) -> Tuple[Tuple[int, ...], torch.dtype]:
    if isinstance(space, gym.spaces.Discrete):
        return (), torch.int64
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(
            f"Observation '{key}' has unsupported space {space}; supported are Box, "
            f"Discrete and a Dict of those. Wrap the env to convert it."
        )
    shape = tuple(int(d) for d in space.shape)
    if _is_image(space):
        if shape[-1] in (1, 3, 4) and shape[0] > 4:
            raise ValueError(
                f"Image observation '{key}' of shape {shape} looks channel-last (H, W, C); "
                f"fastrl expects channel-first (C, H, W): transpose it in the env, e.g. "
                f"with an observation wrapper doing np.transpose(obs, (2, 0, 1))."
            )
        return shape, torch.uint8
    return shape, torch.float32


def obs_layout(obs_space: gym.Space) -> ObsLayout:
    """Per observation key, its per-sample shape and storage dtype.

    Box -> key "obs"; Dict -> its own keys (each Box or Discrete); Discrete -> key
    "obs" with shape () int64. Rank-3 uint8 Boxes are images stored uint8 [C, H, W];
    every other Box is stored float32 in its own shape. Raises ValueError for other
    spaces and for images that look channel-last.
    """
    if isinstance(obs_space, gym.spaces.Dict):
        if not obs_space.spaces:
            raise ValueError("The observation Dict space is empty; give it at least one key.")
        return {key: _leaf_layout(key, sub) for key, sub in obs_space.spaces.items()}
    return {"obs": _leaf_layout("obs", obs_space)}


def obs_zeros(lead: Tuple[int, ...], shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros [*lead, *shape] laid out as the trainer stores observations.

    Images ([C, H, W] uint8) are stored channels-last, [*lead, H, W, C] in memory
    and seen as [*lead, C, H, W]: that is the layout oneDNN's convolutions run
    fastest on (fwd+bwd at 1,056 samples: 31% faster in float32, 12% in bfloat16,
    than a channel-first input), so the encoder never reorders a batch, and it
    is the layout ViZDoom renders in, so a frame reaches the buffers in one copy.
    """
    if dtype == torch.uint8 and len(shape) == 3:
        channels, height, width = shape
        return torch.zeros((*lead, height, width, channels), dtype=dtype).movedim(-1, -3)
    return torch.zeros((*lead, *shape), dtype=dtype)


def _leaf_to_tensor(value, space: gym.Space) -> torch.Tensor:
    if isinstance(space, gym.spaces.Discrete):
        return torch.tensor(int(value), dtype=torch.int64)
    # ascontiguousarray is free for the usual contiguous array of the right dtype and
    # fixes negative strides (np.flip, ::-1), which torch.from_numpy refuses.
    np_dtype = np.uint8 if _is_image(space) else np.float32
    return torch.from_numpy(np.ascontiguousarray(value, dtype=np_dtype)).view(space.shape)


def obs_to_tensors(obs, obs_space: gym.Space) -> Dict[str, torch.Tensor]:
    """Convert one env's raw observation to {key: tensor} in the `obs_layout` dtypes.

    obs is a numpy array (Box), an int (Discrete) or a dict of those (Dict). The
    tensors may share memory with `obs` when no conversion is needed, so copy them
    (e.g. into shared memory) before the env reuses its buffers.
    """
    if isinstance(obs_space, gym.spaces.Dict):
        return {key: _leaf_to_tensor(obs[key], sub) for key, sub in obs_space.spaces.items()}
    return {"obs": _leaf_to_tensor(obs, obs_space)}


class RunningNorm(nn.Module):
    """Running mean/variance of a feature vector, applied as a clipped z-score.

    The statistics are float32 buffers, so they are saved in state_dict and carried
    by flat_state to policy workers together with the weights that were trained on
    them.
    """

    def __init__(self, shape: Tuple[int, ...], channels_last: bool = False):
        """shape: the feature's. channels_last: shape is an image's [C, H, W] whose frames
        come channels-last, and the statistics are stored that way too: the z-score and
        the update then walk the frames and the statistics in the same order. A
        compiled forward needs it: inductor reads a graph input as it is stored, and
        with [C, H, W] statistics it transposed the frames in tiles to meet them (the
        compiled learner step 1.04x the time; benchmarks/README.md)."""
        super().__init__()
        if channels_last and len(shape) != 3:
            raise ValueError(f"RunningNorm(channels_last=True) is for [C, H, W] images; got shape {shape}.")

        def filled(value: float) -> torch.Tensor:
            if not channels_last:
                return torch.full(shape, value)
            channels, height, width = shape
            return torch.full((height, width, channels), value).permute(2, 0, 1)

        self.register_buffer("mean", filled(0.0))
        self.register_buffer("var", filled(1.0))
        self.register_buffer("count", torch.zeros(()))

    @torch.no_grad()
    def update(self, x: torch.Tensor, reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """Merge a batch x [..., *shape] into the statistics (parallel-variance formula).

        reduce: sums a float64 tensor over the ranks of a multi-rank run, in place, so
        that the batch merged is every rank's batch together (all of them then hold the
        same statistics); each rank must call it, whether its own batch is empty or
        not. The batch goes in as its count and the sums of x and x^2 taken about the
        running mean: sums add up across ranks where means and variances do not, and
        about a point near the mean the squares lose no precision to cancellation."""
        moments = self.moments(x)
        self.merge(reduce(moments) if reduce is not None else moments)

    @torch.no_grad()
    def moments(self, x: torch.Tensor) -> torch.Tensor:
        """A batch x [..., *shape] as `merge` takes it: float64 [count, sums of x and of
        x^2 about the running mean], which add up across ranks."""
        x = x.reshape(-1, *self.mean.shape)
        # Feature vectors are summed in float64: their values and row counts are
        # anyone's. Image frames (uint8, at most IMAGE_NORM_ROWS a call) in float32:
        # over 256 random frames the sums of deviations came within 0.014 of float64's
        # (a pixel's mean within 1e-4 of a level) and the squares within 4e-7 of
        # them, and doom_battle's update took 27-35 ms a learner step against 67-69
        # (benchmarks/pixel_norm_layout.py, Intel Xeon, one thread).
        dtype = torch.float32 if x.dtype == torch.uint8 else torch.float64
        d = torch.sub(x, _laid_out_as(self.mean.to(dtype), x))
        d_sum = d.sum(dim=0).reshape(-1)
        return torch.cat([d.new_full((1,), x.shape[0]), d_sum, d.square_().sum(dim=0).reshape(-1)]).double()

    @torch.no_grad()
    def merge(self, moments: torch.Tensor) -> None:
        """Merge a batch's `moments` (as `moments` gives them, or several ranks' summed)
        into the statistics; before any other update, as they are taken about the mean."""
        moments = moments.double()
        shift = self.mean.double()
        n = float(moments[0])
        if n == 0:
            return
        d_sum, d_sq = moments[1:].view(2, *self.mean.shape).unbind(0)
        batch_mean = shift + d_sum / n
        batch_var = (d_sq / n - (d_sum / n).square()).clamp(min=0.0)
        count = self.count.double()
        total = count + n
        delta = batch_mean - self.mean.double()
        new_mean = self.mean.double() + delta * (n / total)
        m2 = self.var.double() * count + batch_var * n + delta.square() * (count * n / total)
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise x [N, *shape] (any dtype: uint8 images come out float32) and clip
        it to [-NORM_CLIP, NORM_CLIP]."""
        # One new tensor and two in-place passes, the same numbers as the textbook
        # expression (benchmarks/pixel_norm_layout.py).
        mean, scale = _laid_out_as(self.mean, x), _laid_out_as(torch.rsqrt(self.var + NORM_EPS), x)
        return torch.sub(x, mean).mul_(scale).clamp_(-NORM_CLIP, NORM_CLIP)


def _laid_out_as(stat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-pixel statistics [C, H, W] laid out for arithmetic with images x [N, C, H, W]
    as x is (else stat itself); free when they already are. Against channels-last
    frames, statistics in [C, H, W] order make the innermost loop stride across
    memory: the z-score of a learner's batch of Doom frames took 40% of its step, 2x
    its time laid out alike (4x on an actor's 32 frames; AMD EPYC, one thread), the
    update of the statistics up to 1.4x."""
    if x.dim() == 4 and stat.dim() == 3:
        frames_last = x.is_contiguous(memory_format=torch.channels_last)
        return stat.unsqueeze(0).contiguous(
            memory_format=torch.channels_last if frames_last else torch.contiguous_format)
    return stat


def _mlp(in_dim: int, hidden_sizes: Sequence[int], activation: str) -> Tuple[nn.Sequential, int]:
    layers: List[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(in_dim, size), ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


class VectorEncoder(nn.Module):
    """Float vector (any Box shape, flattened) -> optional normaliser -> MLP."""

    def __init__(self, shape, hidden_sizes, activation, normalize):
        super().__init__()
        self.norm = RunningNorm(shape) if normalize else None
        self.net, self.out_dim = _mlp(int(np.prod(shape, dtype=np.int64)), hidden_sizes, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, *shape] -> features [N, out_dim]."""
        x = x.float()
        if self.norm is not None:
            x = self.norm(x)
        return self.net(x.flatten(1))


class DiscreteEncoder(nn.Module):
    """Discrete observation -> one-hot -> MLP."""

    def __init__(self, space: gym.spaces.Discrete, hidden_sizes, activation):
        super().__init__()
        self.n, self.start = int(space.n), int(space.start)
        self.net, self.out_dim = _mlp(self.n, hidden_sizes, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x int64 [N] -> features [N, out_dim]."""
        return self.net(F.one_hot(x.long() - self.start, self.n).float())


# The conv stacks an image encoder can have, (channels, kernel, stride) per layer.
# fastrl's own ends wide and coarse (128 channels, stride 2: 4x4 cells on an 84x84
# frame, 3x6 on Doom's 72x128), which Doom learns well with at less compute; the
# Nature DQN stack ends narrower and finer (64 channels, stride 1: 7x7 cells), the
# one Atari agents are usually given, Sample Factory's included.
CONV_STACKS = {
    "fastrl": ((32, 8, 4), (64, 4, 2), (128, 3, 2)),
    "nature": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
}


class ConvEncoder(nn.Module):
    """uint8 image [C, H, W] -> /255 (or, with normalize, each pixel's running z-score)
    -> a conv stack of CONV_STACKS (fastrl's: 32k8s4, 64k4s2, 128k3s2) -> FC 512, ELU (or ReLU) after each.

    With bf16=True the convolutions and the FC run under bfloat16 autocast on a
    channels-last input (oneDNN's fast path for bf16 convolutions) and the features
    come back as float32, so the GRU, the heads and the loss stay in float32. The
    weights themselves stay float32: this only changes the arithmetic.
    """

    def __init__(self, key: str, shape: Tuple[int, int, int], bf16: bool = False, normalize: bool = False,
                 stack: str = "fastrl", activation: str = "elu"):
        super().__init__()
        if stack not in CONV_STACKS:
            raise ValueError(f"conv stack {stack!r} is unknown; use one of {sorted(CONV_STACKS)}.")
        if activation not in ("elu", "relu"):
            raise ValueError(f"conv activation {activation!r} is unknown; use elu or relu.")
        self.bf16 = bf16
        # Per-pixel running statistics (as Sample Factory's input normalisation does):
        # the z-score of each pixel against its own history, so the static parts of
        # the screen (HUD, walls seen from the spawn point) fade towards zero and the
        # parts that change stand out, instead of a fixed /255.
        self.norm = RunningNorm(tuple(shape), channels_last=True) if normalize else None
        channels, height, width = shape
        if min(height, width) < CONV_MIN_SIZE:
            raise ValueError(
                f"Image observation '{key}' of shape {shape} is too small for the conv "
                f"encoder, which needs H and W >= {CONV_MIN_SIZE}; resize it in the env."
            )
        # In-place ELUs: their backward then works from the output (grad * (out + 1)
        # where negative) instead of recomputing exp of the input, and no second
        # activation-sized tensor is allocated. The learner's step is ~9% faster.
        act = ACTIVATIONS[activation]
        layers = []
        for out, kernel, stride in CONV_STACKS[stack]:
            layers += [nn.Conv2d(channels, out, kernel, stride), act(inplace=True)]
            channels = out
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        self.conv = nn.Sequential(*layers, nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(channels * height * width, 512), act(inplace=True))
        self.out_dim = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x uint8 [N, C, H, W] -> features [N, 512] float32. A channels-last x (as
        obs_zeros lays out the trainer's buffers) skips a reorder."""
        # Reordered while still uint8 (a quarter of float32's bytes to move); a
        # no-op for the trainer's own buffers.
        x = x.contiguous(memory_format=torch.channels_last)
        if not self.bf16:
            x = x.float().mul_(1.0 / 255.0) if self.norm is None else self.norm(x)
            return self.fc(self.conv(x))
        # Straight to bfloat16, exact for 0..255: this input path took a third of
        # the learner's time when it went through a float32 copy.
        x = x.to(torch.bfloat16).mul_(1.0 / 255.0) if self.norm is None else self.norm(x).to(torch.bfloat16)
        if not torch.is_grad_enabled() and not self.training:
            return self._bf16_layers()(x).float()
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            features = self.fc(self.conv(x))
        return features.float()

    def _bf16_layers(self) -> nn.Sequential:
        """conv and fc with bfloat16 weights, for forwards without gradients.

        Autocast recasts all 1.3M float32 weights on every call, ~6% of an
        actor's 16-sample forward; these copies give the same numbers (the same casts,
        done once) and are refreshed when a weight changed in place (a parameter
        load) or moved. Kept out of the module's registry, so out of state_dict,
        flat_state and .to(). Only a model in eval mode (an actor's) uses them: a
        change is seen through the weights' version counters, which a fused
        optimizer step does not move, so a learner's no-grad forward (the bootstrap
        value of a truncated episode) read the first weights' copies all run, and a
        pixel task whose every episode is cut by a time limit did not learn.
        """
        params = [*self.conv.parameters(), *self.fc.parameters()]
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self.__dict__.get("_bf16_key") == key:
            return self.__dict__["_bf16_copy"]
        layers = self.__dict__.get("_bf16_copy")
        if layers is None or next(layers.parameters()).device != params[0].device:
            self.__dict__["_bf16_copy"] = copy.deepcopy(nn.Sequential(self.conv, self.fc)).to(torch.bfloat16)
        else:
            # New values into the same tensors: a CUDA graph captured over these layers
            # reads their weights from the addresses it saw (fastrl/cuda/graphs.py).
            with torch.no_grad():
                for held, weight in zip(layers.parameters(), params):
                    held.copy_(weight)
        self.__dict__["_bf16_key"] = key
        return self.__dict__["_bf16_copy"]


def gru_step(gi_t: torch.Tensor, h_tm1: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """nn.GRUCell's update, given its input projection gi_t = x_t W_ih^T + b_ih.

    gi_t [N, 3H] and the hidden projection split into PyTorch's gate order (reset r,
    update z, new n); h_t = (h_tm1 - n) * z + n, the same operations in the same
    order as torch's own cell, so the two agree to the last bit but for the GEMMs.
    """
    if gi_t.shape[-1] != w_hh.shape[0] or h_tm1.shape[-1] * 3 != w_hh.shape[0]:
        raise ValueError(f"gru_step needs gi_t [N, 3H] and h_tm1 [N, H] for w_hh {tuple(w_hh.shape)}; "
                         f"got {tuple(gi_t.shape)} and {tuple(h_tm1.shape)}.")
    i_r, i_z, i_n = gi_t.chunk(3, -1)
    h_r, h_z, h_n = F.linear(h_tm1, w_hh, b_hh).chunk(3, -1)
    r_t = torch.sigmoid(h_r + i_r)
    z_t = torch.sigmoid(h_z + i_z)
    n_t = torch.tanh(i_n + h_n * r_t)
    return (h_tm1 - n_t) * z_t + n_t


class ActOutput(NamedTuple):
    """One inference step: actions [B, action_dim], logp [B], values [B], rnn_state [B, H]."""

    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    rnn_state: torch.Tensor


class EvalOutput(NamedTuple):
    """Learner unroll over T transitions plus the bootstrap step.

    logp, entropy [T, B]; values [T+1, B]; core_out [T+1, B, F]; rnn_states
    [T+1, B, H], the hidden state carried into each step before the episode-start
    reset (so for an episode ending at step t, rnn_states[t+1] is its final state).
    """

    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor
    core_out: torch.Tensor
    rnn_states: torch.Tensor
    uniform_kl: Optional[torch.Tensor]  # [T, B] symmetric KL to the uniform policy, when asked for; else None


class ActorCritic(nn.Module):
    """Encoders per observation key, an optional GRU core, policy and value heads.

    Args:
        obs_space: observation space (Box, Discrete, or Dict of those).
        action_space: any space `ActionSpec.from_space` supports.
        hidden_sizes: MLP widths for vector and discrete observations.
        use_rnn: add a GRU core of `rnn_size` after the encoders.
        activation: "tanh", "relu" or "elu" for the MLPs.
        normalize_obs: keep running statistics of vector observations and of each
            image pixel, and feed the clipped z-scores to the encoders; the learner
            updates them via `update_normalizer`.
        conv_bf16: run image encoders in bfloat16 (see ConvEncoder); worth it only
            where it measures faster (fastrl.tuning.precision decides).
        normalize_returns: keep running statistics of the value targets; the value
            head then predicts normalised values and `value_scale()` maps them back.
        separate_critic: give the value head its own feed-forward encoders instead of
            sharing the policy's encoders and core. Sharing halves the compute (what
            image models want); separate weights keep the value loss, whose scale
            grows with the returns, from pulling on the policy's features (what small
            vector-observation models learn faster with).
        encoder_init_gain, policy_init_gain: orthogonal-init gains of the encoders'
            conv and linear layers and of the policy head.
        conv_stack: the image encoders' conv layers, a key of CONV_STACKS.
        conv_activation: "elu" or "relu", after each of the image encoders' layers.

    Attributes used by callers: `layout` (obs_layout of obs_space), `action_spec`,
    `rnn_state_size` (0 without an RNN), `core_size` (width of core_out).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (64, 64),
        use_rnn: bool = False,
        rnn_size: int = 512,
        activation: str = "tanh",
        normalize_obs: bool = False,
        separate_critic: bool = False,
        conv_bf16: bool = False,
        normalize_returns: bool = False,
        encoder_init_gain: float = math.sqrt(2.0),
        policy_init_gain: float = 0.01,
        conv_stack: str = "fastrl",
        conv_activation: str = "elu",
    ):
        super().__init__()
        self.conv_bf16 = conv_bf16
        self.conv_stack = conv_stack
        self.conv_activation = conv_activation
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is unknown; use one of {sorted(ACTIVATIONS)}.")
        if any(int(h) < 1 for h in hidden_sizes):
            raise ValueError(f"hidden_sizes={tuple(hidden_sizes)} must all be positive integers.")
        if use_rnn and rnn_size < 1:
            raise ValueError(f"rnn_size={rnn_size} must be >= 1 when use_rnn=True.")
        self.layout = obs_layout(obs_space)
        self.action_spec = ActionSpec.from_space(action_space)
        self.obs_keys = list(self.layout)

        self.encoders = self._build_encoders(obs_space, hidden_sizes, activation, normalize_obs)
        features = sum(e.out_dim for e in self.encoders)
        self.critic_encoders = (self._build_encoders(obs_space, hidden_sizes, activation, normalize_obs)
                                if separate_critic else None)

        self.core = nn.GRUCell(features, rnn_size) if use_rnn else None
        self.rnn_state_size = rnn_size if use_rnn else 0
        self.core_size = rnn_size if use_rnn else features

        self.policy_head = nn.Linear(self.core_size, self.action_spec.num_params)
        critic_features = sum(e.out_dim for e in self.critic_encoders) if separate_critic else self.core_size
        self.value_head = nn.Linear(critic_features, 1)
        # Box policies: a state-independent log-std, started at 0 (std 1).
        self.log_std = None
        if self.action_spec.is_continuous:
            self.log_std = nn.Parameter(torch.zeros(self.action_spec.action_dim))
        # Statistics of the value targets in return units, fed by the learner.
        self.return_norm = RunningNorm(()) if normalize_returns else None
        self._init_weights(encoder_init_gain, policy_init_gain)

    def value_scale(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(mean, std): the value head's output v stands for v * std + mean in return
        units; (0, 1) without return normalisation."""
        if self.return_norm is None:
            return self.value_head.bias.new_zeros(()), self.value_head.bias.new_ones(())
        return self.return_norm.mean, torch.sqrt(self.return_norm.var + NORM_EPS)

    def _build_encoders(self, obs_space, hidden_sizes, activation, normalize_obs) -> nn.ModuleList:
        # A ModuleList in layout order rather than a ModuleDict: Dict keys may hold
        # characters (".") that module names cannot.
        encoders = []
        for key, (shape, dtype) in self.layout.items():
            space = obs_space[key] if isinstance(obs_space, gym.spaces.Dict) else obs_space
            if dtype == torch.uint8:
                encoders.append(ConvEncoder(key, shape, bf16=self.conv_bf16, normalize=normalize_obs,
                                            stack=self.conv_stack, activation=self.conv_activation))
            elif dtype == torch.int64:
                encoders.append(DiscreteEncoder(space, hidden_sizes, activation))
            else:
                encoders.append(VectorEncoder(shape, hidden_sizes, activation, normalize_obs))
        return nn.ModuleList(encoders)

    def _init_weights(self, encoder_gain: float, policy_gain: float) -> None:
        # Orthogonal init keeps activations' scale through depth; the default tiny
        # policy-head gain starts the policy near uniform (or near mean 0) so early
        # exploration does not depend on the random init. The GRU keeps PyTorch's
        # default init.
        encoder_modules = list(self.encoders.modules())
        if self.critic_encoders is not None:
            encoder_modules += list(self.critic_encoders.modules())
        for module in encoder_modules:
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(module.weight, gain=encoder_gain)
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.policy_head.weight, gain=policy_gain)
        nn.init.zeros_(self.policy_head.bias)
        nn.init.orthogonal_(self.value_head.weight, gain=1.0)
        nn.init.zeros_(self.value_head.bias)

    def _check_inputs(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor) -> None:
        if obs.keys() != self.layout.keys():
            raise ValueError(
                f"Observation dict has keys {sorted(obs)} but the model expects "
                f"{sorted(self.layout)}; build it with obs_to_tensors / obs_layout."
            )
        if rnn_state.dim() != 2 or rnn_state.shape[1] != self.rnn_state_size:
            raise ValueError(
                f"rnn_state must be [B, {self.rnn_state_size}] (use torch.zeros(B, "
                f"model.rnn_state_size)), got {tuple(rnn_state.shape)}."
            )

    def _encode(self, obs: Dict[str, torch.Tensor], encoders=None) -> torch.Tensor:
        """obs {key: [N, *shape]} -> concatenated features [N, F_enc]."""
        encoders = self.encoders if encoders is None else encoders
        features = [enc(obs[key]) for key, enc in zip(self.obs_keys, encoders)]
        return features[0] if len(features) == 1 else torch.cat(features, dim=-1)

    def _values(self, obs: Dict[str, torch.Tensor], core_out: torch.Tensor) -> torch.Tensor:
        """Values [N] from the shared core output, or from the critic's own encoders."""
        if self.critic_encoders is None:
            return self.value_head(core_out).squeeze(-1)
        return self.value_head(self._encode(obs, self.critic_encoders)).squeeze(-1)

    def _core_step(self, x: torch.Tensor, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One core step: (features [N, F_enc], state [N, H]) -> (core_out, new state)."""
        if self.core is None:
            return x, h
        h = gru_step(self._gru_input(x), h, self.core.weight_hh, self.core.bias_hh)
        return h, h

    def _gru_input(self, x: torch.Tensor) -> torch.Tensor:
        """The GRU's input projection x W_ih^T + b_ih [N, 3H] of features [N, F_enc]."""
        return F.linear(x, self.core.weight_ih, self.core.bias_ih)

    def _distribution(self, core_out: torch.Tensor):
        return self.action_spec.distribution(self.policy_head(core_out), self.log_std)

    def refresh_acting_copies(self) -> None:
        """Bring the bf16 encoders' weight copies for acting up to the weights now, in
        place. A forward does this itself when it sees new weights, but a CUDA graph's
        replay runs no Python: whoever replays one calls this after each reload."""
        for encoder in [*self.encoders, *(self.critic_encoders or [])]:
            if isinstance(encoder, ConvEncoder) and encoder.bf16:
                encoder._bf16_layers()

    def act(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor, deterministic: bool = False) -> ActOutput:
        """One inference step for a batch of B envs.

        obs: {key: [B, *shape]} in obs_layout dtypes; rnn_state: [B, rnn_state_size]
        (the caller zeroes the rows of envs that just started an episode). With
        deterministic=True the action is the distribution's mode. Call under
        torch.no_grad().
        """
        self._check_inputs(obs, rnn_state)
        core_out, rnn_state = self._core_step(self._encode(obs), rnn_state)
        dist = self._distribution(core_out)
        actions = dist.mode() if deterministic else dist.sample()
        values = self._values(obs, core_out)
        return ActOutput(actions, dist.log_prob(actions), values, rnn_state)

    def evaluate(
        self,
        obs_seq: Dict[str, torch.Tensor],
        rnn_state0: torch.Tensor,
        episode_start: torch.Tensor,
        actions: torch.Tensor,
        uniform_kl: bool = False,
    ) -> EvalOutput:
        """Re-run the policy over a trajectory batch for the loss.

        obs_seq: {key: [T+1, B, *shape]}, T transitions plus the bootstrap obs.
        rnn_state0: [B, H], the state before step 0.
        episode_start: [T+1, B], 1 (or True) where an episode begins; the GRU state
            is zeroed before processing that step.
        actions: [T, B, action_dim] taken at the first T steps.
        uniform_kl: also return each step's symmetric KL to the uniform policy (the
            `symmetric_kl` exploration term; discrete actions only). Off, the loss
            that does not use it builds none of it.
        """
        self._check_inputs(obs_seq, rnn_state0)
        if episode_start.dim() != 2:
            raise ValueError(f"episode_start must be [T+1, B], got {tuple(episode_start.shape)}.")
        steps, batch = episode_start.shape
        horizon = steps - 1
        expected = (horizon, batch, self.action_spec.action_dim)
        if tuple(actions.shape) != expected or rnn_state0.shape[0] != batch:
            raise ValueError(
                f"With episode_start of shape {(steps, batch)}, actions must be {expected} "
                f"and rnn_state0 [{batch}, {self.rnn_state_size}]; got {tuple(actions.shape)} "
                f"and {tuple(rnn_state0.shape)}."
            )

        # Encoders always run on the whole [(T+1)*B] batch: they hold almost all the
        # compute, and only the GRU's time dependency needs a loop.
        obs_flat = {key: value.flatten(0, 1) for key, value in obs_seq.items()}
        x = self._encode(obs_flat)
        if self.core is None:
            core_flat = x
            rnn_states = x.new_zeros(steps, batch, 0)
        else:
            # The input half of every step in one GEMM over all T+1 steps, instead of
            # T+1 small ones (and one for its gradient): only the hidden half needs
            # the previous step.
            gi = self._gru_input(x).view(steps, batch, -1)
            keep = (1.0 - episode_start.to(x.dtype)).unsqueeze(-1)
            outputs, rnn_states = gru_sequence(gi, rnn_state0, keep, self.core.weight_hh, self.core.bias_hh)
            core_flat = outputs.flatten(0, 1)

        values = self._values(obs_flat, core_flat).view(steps, batch)
        # Rows are time-major, so the first T*B rows are the T acting steps; the
        # bootstrap step needs only its value.
        dist = self._distribution(core_flat[: horizon * batch])
        flat_actions = actions.reshape(horizon * batch, -1)
        logp = dist.log_prob(flat_actions).view(horizon, batch)
        entropy = dist.entropy().view(horizon, batch)
        kl_t = dist.symmetric_kl_to_uniform().view(horizon, batch) if uniform_kl else None
        return EvalOutput(logp, entropy, values, core_flat.view(steps, batch, -1), rnn_states, kl_t)

    def evaluate_samples(self, obs: Dict[str, torch.Tensor], actions: torch.Tensor, uniform_kl: bool = False):
        """`evaluate` for single samples of a feed-forward model, in no order:
        obs {key: [N, *shape]} and actions [N, action_dim] -> (logp, entropy, values,
        uniform_kl or None), each [N]. A GRU's state depends on the steps before, so a
        recurrent model has only `evaluate`."""
        if self.core is not None:
            raise ValueError("evaluate_samples needs a model without a GRU core; a recurrent model "
                             "re-runs whole trajectories with evaluate().")
        n = actions.shape[0]
        if actions.shape != (n, self.action_spec.action_dim):
            raise ValueError(f"actions must be [N, {self.action_spec.action_dim}], got {tuple(actions.shape)}.")
        x = self._encode(obs)
        dist = self._distribution(x)
        kl = dist.symmetric_kl_to_uniform() if uniform_kl else None
        return dist.log_prob(actions), dist.entropy(), self._values(obs, x), kl

    def values_with_state(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor) -> torch.Tensor:
        """Values [N] of extra observations {key: [N, *shape]} given their states [N, H].

        For time-limit-truncated episodes the learner passes the final observation
        with the matching row of EvalOutput.rnn_states.
        """
        self._check_inputs(obs, rnn_state)
        if self.critic_encoders is not None:
            return self._values(obs, None)
        core_out, _ = self._core_step(self._encode(obs), rnn_state)
        return self._values(obs, core_out)

    def update_normalizer(self, obs: Dict[str, torch.Tensor], keep: Optional[torch.Tensor] = None,
                          reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """Fold a batch {key: [*lead, *shape]} into the running observation statistics.

        keep: bool [*lead], the samples to fold in (all of them when None).
        reduce: the ranks' sum, as RunningNorm.update takes it.

        Vector keys and images are normalised (discrete keys are one-hot encoded and
        are not); a model built without normalize_obs ignores the call, so the learner
        can call it unconditionally. Images contribute at most IMAGE_NORM_ROWS random
        kept frames a call: per-pixel statistics of a whole 1,024-frame batch would
        cost a float64 copy of ~230 MB per learner step, and a few hundred frames a
        step still see millions of frames an hour. The frames are picked before
        anything is copied, so only those few hundred leave the batch.
        """
        encoders = list(zip(self.obs_keys, self.encoders))
        if self.critic_encoders is not None:
            encoders += list(zip(self.obs_keys, self.critic_encoders))
        kept = None if keep is None else keep.reshape(-1).nonzero().squeeze(1)
        for key, encoder in encoders:
            if getattr(encoder, "norm", None) is None:
                continue
            if key not in obs:
                raise ValueError(f"update_normalizer needs observation key '{key}', got {sorted(obs)}.")
            rows = obs[key].reshape(-1, *self.layout[key][0])  # a view of a time-major batch
            index = kept
            if isinstance(encoder, ConvEncoder):
                available = rows.shape[0] if index is None else index.numel()
                if available > IMAGE_NORM_ROWS:
                    pick = torch.randperm(available, device=rows.device)[:IMAGE_NORM_ROWS]
                    index = pick if index is None else index[pick]
            encoder.norm.update(rows if index is None else rows.index_select(0, index), reduce)


def _float_tensors(model: nn.Module) -> List[torch.Tensor]:
    # state_dict order is registration order: identical for two models built from the
    # same config, which is all the flat layout relies on. Integer buffers (none
    # here today) would not survive a float32 round trip, so they are left out.
    return [t for t in model.state_dict().values() if t.is_floating_point()]


def flat_state_size(model: nn.Module) -> int:
    """Number of float32 values `flat_state(model)` returns."""
    return sum(t.numel() for t in _float_tensors(model))


def flat_state(model: nn.Module) -> torch.Tensor:
    """All parameters and float buffers as one 1-D float32 tensor, in a fixed order."""
    return torch.cat([t.reshape(-1).to(torch.float32) for t in _float_tensors(model)])


@torch.no_grad()
def load_flat_state(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a `flat_state` vector (from a model of the same config) into `model`."""
    tensors = _float_tensors(model)
    size = sum(t.numel() for t in tensors)
    if flat.dim() != 1 or flat.numel() != size:
        raise ValueError(
            f"load_flat_state got a tensor of shape {tuple(flat.shape)} but this model needs "
            f"a 1-D tensor of {size} values; build both models with the same config."
        )
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


# --------------------------------------------------------------------------------------
# From the configuration

def resolve_device(cfg) -> str:
    """cfg.device with auto decided: cuda when torch sees a device, else cpu."""
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX). Where it
    does not, oneDNN emulates bf16, slower than fp32, so bf16 is not even worth
    timing; where it does, bf16 may still be slower (fastrl.tuning.precision)."""
    # Private torch helpers: a torch without them counts as no native bf16.
    return any(getattr(torch.cpu, probe, lambda: False)()
               for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def has_images(obs_space: gym.Space) -> bool:
    """Whether the model of `obs_space` has an image encoder, the only part that
    --precision changes."""
    return any(dtype == torch.uint8 for _, dtype in obs_layout(obs_space).values())


class Precision(NamedTuple):
    """The arithmetic of the image encoders, "fp32" or "bf16", for each role, and
    why it was chosen (printed at start-up).

    Acting and learning choose apart: an actor's forward on a few samples and the
    learner's forward and backward on a thousand run different kernels, and bf16
    can win the one and lose the other on the same CPU. Every process of a run gets
    it through SharedContext, decided once in the runner before any child starts.
    """

    acting: str
    learning: str
    why: str

    def describe(self) -> str:
        if self.acting == self.learning:
            return f"precision: {self.acting} ({self.why})"
        return f"precision: acting {self.acting}, learning {self.learning} ({self.why})"


def build_model(cfg, obs_space, action_space, precision: str = "fp32") -> ActorCritic:
    """The network of `cfg`, its image encoders computing in `precision` ("fp32" or
    "bf16": one role's choice from a Precision). The arithmetic changes no weight,
    so a model built only for its weights (the runner's first parameters, a
    checkpoint's tests) can keep the default."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"build_model takes precision fp32 or bf16, not {precision!r}; "
                         "resolve --precision auto first (fastrl.tuning.precision).")
    return ActorCritic(
        obs_space,
        action_space,
        hidden_sizes=cfg.hidden_size_tuple,
        use_rnn=cfg.use_rnn,
        rnn_size=cfg.rnn_size,
        activation=cfg.activation,
        normalize_obs=cfg.normalize_obs,
        separate_critic=cfg.separate_critic,
        conv_bf16=precision == "bf16",
        normalize_returns=cfg.normalize_returns,
        encoder_init_gain=cfg.encoder_init_gain,
        policy_init_gain=cfg.policy_init_gain,
        conv_stack=cfg.conv_stack,
        conv_activation=cfg.conv_activation,
    )
