"""The actor-critic network and the observation layout it shares with the buffers.

Observations travel as {key: tensor}; `obs_layout` fixes each key's shape and storage
dtype so shared memory can be allocated before any env runs. Images stay uint8 until
inside the model (a quarter of float32's bytes to store and copy). `act` is one
inference step, `evaluate` the learner's unroll; both share `_encode` and `gru_step`,
so acting and learning compute the same numbers.
"""

import copy
import math
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fastrl.algo.distributions import ACTION_MASK_KEY, ActionSpec
from fastrl.algo.gru_sequence import gru_sequence
from fastrl.algo.model_registry import ModelError, model_builder

ObsLayout = Dict[str, Tuple[Tuple[int, ...], torch.dtype]]

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
NORM_CLIP = 10.0
NORM_EPS = 1e-8
IMAGE_NORM_ROWS = 256  # frames per learner step that update per-pixel image statistics
CONV_MIN_SIZE = 36  # smallest H and W every conv stack (CONV_STACKS) accepts


def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def _is_mask_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.MultiBinary) or (
        isinstance(space, gym.spaces.Box) and (np.issubdtype(space.dtype, np.integer) or space.dtype == np.bool_))


def _leaf_layout(key: str, space: gym.Space) -> Tuple[Tuple[int, ...], torch.dtype]:
    if key == ACTION_MASK_KEY:
        # Stored as bool: it never meets an encoder, only the action distribution.
        if not _is_mask_space(space):
            raise ValueError(f"Observation '{key}' has space {space}, but an action mask must be an integer or "
                             f"bool Box of 0/1 (or MultiBinary), 1 where an action is allowed.")
        return tuple(int(d) for d in space.shape), torch.bool
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
    """Per observation key, its per-sample (shape, storage dtype): rank-3 uint8 Boxes
    are images kept uint8 [C, H, W], other Boxes float32, Discrete int64, a Dict's
    action mask (ACTION_MASK_KEY) bool."""
    if isinstance(obs_space, gym.spaces.Dict):
        if not obs_space.spaces:
            raise ValueError("The observation Dict space is empty; give it at least one key.")
        return {key: _leaf_layout(key, sub) for key, sub in obs_space.spaces.items()}
    return {"obs": _leaf_layout("obs", obs_space)}


def check_spaces(obs_space: gym.Space, action_space: gym.Space) -> None:
    """ValueError, in one sentence, where no model fits these spaces: one unsupported, or
    an action mask that does not fit the actions. Start-up asks before any process starts."""
    layout = obs_layout(obs_space)
    spec = ActionSpec.from_space(action_space)
    if ACTION_MASK_KEY in layout:
        spec.check_mask_shape(layout[ACTION_MASK_KEY][0])
        if len(layout) == 1:
            raise ValueError(f"The observation holds only {ACTION_MASK_KEY!r}; give the policy something to see "
                             "beside it.")


def obs_zeros(lead: Tuple[int, ...], shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros [*lead, *shape] in the trainer's storage layout: images channels-last in
    memory (oneDNN's fastest conv layout, and ViZDoom's) but seen as [C, H, W]."""
    if dtype == torch.uint8 and len(shape) == 3:
        channels, height, width = shape
        return torch.zeros((*lead, height, width, channels), dtype=dtype).movedim(-1, -3)
    return torch.zeros((*lead, *shape), dtype=dtype)


def _leaf_to_tensor(value, space: gym.Space) -> torch.Tensor:
    if isinstance(space, gym.spaces.Discrete):
        return torch.tensor(int(value), dtype=torch.int64)
    # ascontiguousarray fixes negative strides, which torch.from_numpy refuses.
    np_dtype = np.uint8 if _is_image(space) else np.float32
    return torch.from_numpy(np.ascontiguousarray(value, dtype=np_dtype)).view(space.shape)


def obs_to_tensors(obs, obs_space: gym.Space) -> Dict[str, torch.Tensor]:
    """One env's raw observation as {key: tensor} in `obs_layout` dtypes. The tensors
    may share memory with `obs`: copy them before the env reuses its buffers."""
    if isinstance(obs_space, gym.spaces.Dict):
        return {key: torch.from_numpy(np.asarray(obs[key]) != 0).view(sub.shape) if key == ACTION_MASK_KEY
                else _leaf_to_tensor(obs[key], sub) for key, sub in obs_space.spaces.items()}
    return {"obs": _leaf_to_tensor(obs, obs_space)}


class RunningNorm(nn.Module):
    """Running mean/variance of a feature, applied as a clipped z-score. Kept as
    buffers, so checkpoints and flat_state carry them with the weights."""

    def __init__(self, shape: Tuple[int, ...], channels_last: bool = False):
        """channels_last: store an image's statistics in its frames' memory order, so a
        compiled forward need not transpose the frames to meet them."""
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
        """Merge a batch x [..., *shape] into the statistics. In a multi-rank run
        `reduce` sums the moments across ranks in place, and every rank must call it."""
        moments = self.moments(x)
        self.merge(reduce(moments) if reduce is not None else moments)

    @torch.no_grad()
    def moments(self, x: torch.Tensor) -> torch.Tensor:
        """x as float64 [count, sum of x - mean, sum of (x - mean)^2]: sums add up across
        ranks, and about the mean the squares lose no precision."""
        x = x.reshape(-1, *self.mean.shape)
        # uint8 frames (at most IMAGE_NORM_ROWS) are summed in float32: accurate enough
        # and faster (pixel_norm_layout in benchmarks/experiments/README.md).
        dtype = torch.float32 if x.dtype == torch.uint8 else torch.float64
        d = torch.sub(x, _laid_out_as(self.mean.to(dtype), x))
        d_sum = d.sum(dim=0).reshape(-1)
        return torch.cat([d.new_full((1,), x.shape[0]), d_sum, d.square_().sum(dim=0).reshape(-1)]).double()

    @torch.no_grad()
    def merge(self, moments: torch.Tensor) -> None:
        """Merge `moments` (one rank's, or all ranks' summed) before the mean moves. Non-finite
        moments (a NaN or inf observation) are left out: merged, they would poison the
        statistics for good, and every checkpoint after."""
        moments = moments.double()
        if not bool(torch.isfinite(moments).all()):
            return
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
        """x [N, *shape] -> clipped z-score (float32 for uint8 images)."""
        mean, scale = _laid_out_as(self.mean, x), _laid_out_as(torch.rsqrt(self.var + NORM_EPS), x)
        return torch.sub(x, mean).mul_(scale).clamp_(-NORM_CLIP, NORM_CLIP)


def _laid_out_as(stat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-pixel statistics laid out in memory like the images x they meet, so the
    elementwise loops walk both in order; other statistics unchanged."""
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
        return self.net(F.one_hot(x.long() - self.start, self.n).float())


# Conv stacks, (channels, kernel, stride) per layer. fastrl's ends wide and coarse, which
# Doom learns well with at less compute; "nature" is the usual Atari (Nature DQN) stack.
CONV_STACKS = {
    "fastrl": ((32, 8, 4), (64, 4, 2), (128, 3, 2)),
    "nature": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
}


class ConvEncoder(nn.Module):
    """uint8 image [C, H, W] -> /255 or per-pixel z-score -> conv stack -> FC 512.

    bf16 runs the convs and FC in bfloat16 on a channels-last input (oneDNN's fast
    path); the weights stay float32 and the features come back float32.
    """

    def __init__(self, key: str, shape: Tuple[int, int, int], bf16: bool = False, normalize: bool = False,
                 stack: str = "fastrl", activation: str = "elu"):
        super().__init__()
        if stack not in CONV_STACKS:
            raise ValueError(f"conv stack {stack!r} is unknown; use one of {sorted(CONV_STACKS)}.")
        if activation not in ("elu", "relu"):
            raise ValueError(f"conv activation {activation!r} is unknown; use elu or relu.")
        self.bf16 = bf16
        # Per-pixel z-scores fade the static parts of the screen and make what changes stand out.
        self.norm = RunningNorm(tuple(shape), channels_last=True) if normalize else None
        channels, height, width = shape
        if min(height, width) < CONV_MIN_SIZE:
            raise ValueError(
                f"Image observation '{key}' of shape {shape} is too small for the conv "
                f"encoder, which needs H and W >= {CONV_MIN_SIZE}; resize it in the env."
            )
        # In-place activations: ELU's backward works from its output, with no second
        # activation-sized tensor.
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
        """x uint8 [N, C, H, W] -> features [N, 512] float32."""
        # Reorder while still uint8; a no-op on the trainer's channels-last buffers.
        x = x.contiguous(memory_format=torch.channels_last)
        if not self.bf16:
            x = x.float().mul_(1.0 / 255.0) if self.norm is None else self.norm(x)
            return self.fc(self.conv(x))
        # Straight to bfloat16 (exact for 0..255), skipping a float32 copy.
        x = x.to(torch.bfloat16).mul_(1.0 / 255.0) if self.norm is None else self.norm(x).to(torch.bfloat16)
        if not torch.is_grad_enabled() and not self.training:
            return self._bf16_layers()(x).float()
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            features = self.fc(self.conv(x))
        return features.float()

    def _bf16_layers(self) -> nn.Sequential:
        """conv and fc with bfloat16 weights, so an actor's forward does not recast
        every weight each call. Kept outside the module (not in state_dict, not moved by
        .to()) and refreshed when a weight's address or version changes. Eval mode
        only: a fused optimizer step does not bump versions, so a learner would read
        stale copies."""
        params = [*self.conv.parameters(), *self.fc.parameters()]
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self.__dict__.get("_bf16_key") == key:
            return self.__dict__["_bf16_copy"]
        layers = self.__dict__.get("_bf16_copy")
        if layers is None or next(layers.parameters()).device != params[0].device:
            self.__dict__["_bf16_copy"] = copy.deepcopy(nn.Sequential(self.conv, self.fc)).to(torch.bfloat16)
        else:
            # Same tensors, new values: a captured CUDA graph reads the addresses it saw.
            with torch.no_grad():
                for held, weight in zip(layers.parameters(), params):
                    held.copy_(weight)
        self.__dict__["_bf16_key"] = key
        return self.__dict__["_bf16_copy"]


class ObsInput(nn.Module):
    """One observation key as a registered model's encoder receives it: images float32 in
    [0, 1], other Boxes float32, each a (per-pixel) z-score with normalize_obs; Discrete int64."""

    def __init__(self, shape: Tuple[int, ...], dtype: torch.dtype, normalize: bool):
        super().__init__()
        self.image = dtype == torch.uint8
        self.norm = RunningNorm(shape, channels_last=self.image) if normalize and dtype != torch.int64 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.image:
            x = x.contiguous(memory_format=torch.channels_last)  # a no-op on the trainer's buffers
            return x.float().mul_(1.0 / 255.0) if self.norm is None else self.norm(x)
        if x.dtype == torch.int64:
            return x
        return x.float() if self.norm is None else self.norm(x.float())


class UserEncoder(nn.Module):
    """The encoder of a registered model (--model), between fastrl's observation inputs and
    its core: `net` gets the observation as its space is shaped (a tensor, or a dict for a
    Dict space) and returns features [N, out_dim]. bf16 runs it under bfloat16 autocast, the
    features coming back float32, as --precision bf16 asks of an image encoder."""

    def __init__(self, name: str, net: nn.Module, layout: ObsLayout, as_dict: bool, normalize: bool, bf16: bool):
        """layout: the keys the encoder sees (an action mask is none of them)."""
        super().__init__()
        self.name, self.layout, self.keys, self.as_dict, self.bf16 = name, layout, list(layout), as_dict, bf16
        # A ModuleList, not a ModuleDict: Dict keys may hold "." which module names cannot.
        self.inputs = nn.ModuleList(ObsInput(shape, dtype, normalize) for shape, dtype in layout.values())
        self.net = net
        self.out_dim = self._checked_out_dim()

    def _features(self, obs: Dict[str, torch.Tensor]):
        x = {key: prepare(obs[key]) for key, prepare in zip(self.keys, self.inputs)}
        if not self.bf16:
            return self.net(x if self.as_dict else x[self.keys[0]])
        with torch.autocast(next(iter(x.values())).device.type, dtype=torch.bfloat16):
            return self.net(x if self.as_dict else x[self.keys[0]])

    def forward(self, obs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return self._features(obs).float()

    @torch.no_grad()
    def _checked_out_dim(self) -> int:
        """The features' width, from a forward of two zero observations (in eval mode, so that
        no running statistic moves); an output that does not fit raises ModelError."""
        rows = 2
        shapes = {key: shape for key, (shape, _) in self.layout.items()}
        batch = {key: obs_zeros((rows,), shape, dtype) for key, (shape, dtype) in self.layout.items()}
        training = self.training
        self.eval()
        try:
            out = self._features(batch)
        except Exception as err:  # noqa: BLE001 - the user's forward failed, however it did
            first = (str(err).strip().splitlines() or [""])[0]
            raise ModelError(f"Model {self.name!r}: its encoder failed on a batch of {rows} observations of "
                             f"shapes {shapes} ({type(err).__name__}: {first}).") from None
        finally:
            self.train(training)
        declared = getattr(self.net, "out_dim", None)
        expected = f"[{rows}, {declared if declared is not None else 'features'}]"
        if not isinstance(out, torch.Tensor):
            raise ModelError(f"Model {self.name!r}: its encoder must return one tensor {expected} for {rows} "
                             f"observations, but returned a {type(out).__name__}.")
        if out.dim() != 2 or out.shape[0] != rows or (declared is not None and out.shape[1] != declared):
            raise ModelError(f"Model {self.name!r}: its encoder must return features of shape {expected} for "
                             f"{rows} observations, but returned {list(out.shape)}.")
        if not out.is_floating_point():
            raise ModelError(f"Model {self.name!r}: its encoder returned {out.dtype} features; return "
                             "floating-point ones.")
        return int(out.shape[1])


def build_user_encoder(name: str, obs_space: gym.Space, layout: ObsLayout, spec: "ModelSpec") -> UserEncoder:
    """Model `name`'s encoder, from its builder (fastrl.algo.model_registry), checked to fit."""
    net = model_builder(name)(obs_space, spec)
    if not isinstance(net, nn.Module):
        raise ModelError(f"Model {name!r}: its builder must return a torch.nn.Module, the encoder, but returned a "
                         f"{type(net).__name__}.")
    return UserEncoder(name, net, layout, isinstance(obs_space, gym.spaces.Dict), spec.normalize_obs, spec.conv_bf16)


def gru_step(gi_t: torch.Tensor, h_tm1: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    """nn.GRUCell's update given its input projection gi_t = x_t W_ih^T + b_ih, in
    torch's gate and operation order, so it matches torch's cell bit for bit but for
    the GEMMs."""
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
    """Learner unroll: logp, entropy [T, B]; values [T+1, B]; core_out [T+1, B, F];
    rnn_states [T+1, B, H], each step's incoming state before the episode-start reset."""

    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor
    core_out: torch.Tensor
    rnn_states: torch.Tensor
    uniform_kl: Optional[torch.Tensor]  # [T, B] symmetric KL to uniform, when asked for


class ModelSpec(NamedTuple):
    """The architecture options of an ActorCritic (Config's, by build_model)."""
    hidden_sizes: Sequence[int] = (64, 64)
    use_rnn: bool = False
    rnn_size: int = 512
    activation: str = "tanh"
    normalize_obs: bool = False
    separate_critic: bool = False
    conv_bf16: bool = False  # the image encoders compute in bf16
    normalize_returns: bool = False
    encoder_init_gain: float = math.sqrt(2.0)
    policy_init_gain: float = 0.01
    conv_stack: str = "fastrl"
    conv_activation: str = "elu"
    model: str = ""  # a registered model's encoder in place of fastrl's (fastrl.algo.model_registry)
    log_std_init: float = 0.0  # continuous actions: the Gaussian's starting log-std, in bounded actions' half-widths


class ActorCritic(nn.Module):
    """Encoders per observation key, an optional GRU core, policy and value heads.
    separate_critic gives the value head its own encoders: more compute, but the value
    loss no longer pulls on the policy's features, which small vector models learn
    faster with. The learner feeds the normalisers (`update_normalizer`, `return_norm`).
    A registered model (spec.model) replaces the encoders of every key with one of its own.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, spec: Optional[ModelSpec] = None):
        spec = ModelSpec() if spec is None else spec
        (hidden_sizes, use_rnn, rnn_size, activation, normalize_obs, separate_critic, conv_bf16, normalize_returns,
         encoder_init_gain, policy_init_gain, conv_stack, conv_activation, model, log_std_init) = spec
        super().__init__()
        self.model, self.model_spec = model, spec
        self.conv_bf16 = conv_bf16
        self.conv_stack = conv_stack
        self.conv_activation = conv_activation
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is unknown; use one of {sorted(ACTIVATIONS)}.")
        if any(int(h) < 1 for h in hidden_sizes):
            raise ValueError(f"hidden_sizes={tuple(hidden_sizes)} must all be positive integers.")
        if use_rnn and rnn_size < 1:
            raise ValueError(f"rnn_size={rnn_size} must be >= 1 when use_rnn=True.")
        check_spaces(obs_space, action_space)
        self.layout = obs_layout(obs_space)
        self.action_spec = ActionSpec.from_space(action_space)
        # The action mask travels with the observation but is no input feature.
        self.mask_key = ACTION_MASK_KEY if ACTION_MASK_KEY in self.layout else None
        self.obs_keys = [key for key in self.layout if key != self.mask_key]

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
        self.log_std = None
        if self.action_spec.is_continuous:
            self.log_std = nn.Parameter(self.action_spec.start_log_std(log_std_init))
        # Value-target statistics in return units, fed by the learner.
        self.return_norm = RunningNorm(()) if normalize_returns else None
        self._init_weights(encoder_init_gain, policy_init_gain)

    def value_scale(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) that map the value head's output to return units."""
        if self.return_norm is None:
            return self.value_head.bias.new_zeros(()), self.value_head.bias.new_ones(())
        return self.return_norm.mean, torch.sqrt(self.return_norm.var + NORM_EPS)

    def _build_encoders(self, obs_space, hidden_sizes, activation, normalize_obs) -> nn.ModuleList:
        if self.model:
            seen = {key: self.layout[key] for key in self.obs_keys}
            return nn.ModuleList([build_user_encoder(self.model, obs_space, seen, self.model_spec)])
        # A ModuleList, not a ModuleDict: Dict keys may hold "." which module names cannot.
        encoders = []
        for key in self.obs_keys:
            shape, dtype = self.layout[key]
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
        # Orthogonal init keeps activation scale through depth; a small policy gain
        # starts the policy near uniform. The GRU keeps torch's default init, a registered
        # model's encoder the init its builder gave it.
        encoder_modules = [] if self.model else list(self.encoders.modules())
        if self.critic_encoders is not None and not self.model:
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
        if self.model:  # one encoder sees every key
            return encoders[0](obs)
        features = [enc(obs[key]) for key, enc in zip(self.obs_keys, encoders)]
        return features[0] if len(features) == 1 else torch.cat(features, dim=-1)

    def _values(self, obs: Dict[str, torch.Tensor], core_out: torch.Tensor) -> torch.Tensor:
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
        return F.linear(x, self.core.weight_ih, self.core.bias_ih)

    def _distribution(self, core_out: torch.Tensor, obs: Dict[str, torch.Tensor]):
        """The action distribution of core_out's N rows, masked by the first N rows of
        obs's action mask where it has one."""
        mask = None
        if self.mask_key is not None:
            rows = core_out.shape[0]
            mask = obs[self.mask_key][:rows].reshape(rows, -1).bool()
        return self.action_spec.distribution(self.policy_head(core_out), self.log_std, mask)

    def _check_mask(self, obs: Dict[str, torch.Tensor]) -> None:
        """Refuse a row whose mask allows nothing, where that costs no device sync and no
        graph break: on the CPU, not while compiling. Rollout workers check every row
        anyway (sampling/env_split.py); this covers enjoy and the evaluator."""
        mask = obs[self.mask_key]
        if mask.device.type != "cpu" or torch.compiler.is_compiling():
            return
        blocked = self.action_spec.fully_masked(mask.reshape(mask.shape[0], -1).bool())
        if blocked is not None:
            row, component = blocked
            raise ValueError(self.action_spec.nothing_allowed(f"The {ACTION_MASK_KEY!r} of observation {row}",
                                                              component))

    def refresh_acting_copies(self) -> None:
        """Refresh the bf16 acting copies in place. A CUDA graph replay runs no Python,
        so whoever replays one calls this after each weight reload."""
        for encoder in [*self.encoders, *(self.critic_encoders or [])]:
            if isinstance(encoder, ConvEncoder) and encoder.bf16:
                encoder._bf16_layers()

    def act(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor, deterministic: bool = False) -> ActOutput:
        """One inference step for B envs; the caller zeroes the rnn_state rows of new
        episodes. Call under torch.no_grad()."""
        self._check_inputs(obs, rnn_state)
        if self.mask_key is not None:
            self._check_mask(obs)
        core_out, rnn_state = self._core_step(self._encode(obs), rnn_state)
        dist = self._distribution(core_out, obs)
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
        """Re-run the policy over obs_seq {key: [T+1, B, *shape]} (T steps plus the
        bootstrap) from rnn_state0 [B, H], zeroing the state where episode_start [T+1, B]
        is set. uniform_kl also returns each step's symmetric KL to uniform."""
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

        # Encoders (almost all the compute) run on all (T+1)*B rows; only the GRU loops.
        obs_flat = {key: value.flatten(0, 1) for key, value in obs_seq.items()}
        x = self._encode(obs_flat)
        if self.core is None:
            core_flat = x
            rnn_states = x.new_zeros(steps, batch, 0)
        else:
            # The input projection of all steps in one GEMM; only the hidden half is sequential.
            gi = self._gru_input(x).view(steps, batch, -1)
            keep = (1.0 - episode_start.to(x.dtype)).unsqueeze(-1)
            outputs, rnn_states = gru_sequence(gi, rnn_state0, keep, self.core.weight_hh, self.core.bias_hh)
            core_flat = outputs.flatten(0, 1)

        values = self._values(obs_flat, core_flat).view(steps, batch)
        # Time-major rows: the first T*B are the acting steps; the bootstrap needs a value only.
        dist = self._distribution(core_flat[: horizon * batch], obs_flat)
        flat_actions = actions.reshape(horizon * batch, -1)
        logp = dist.log_prob(flat_actions).view(horizon, batch)
        entropy = dist.entropy().view(horizon, batch)
        kl_t = dist.symmetric_kl_to_uniform().view(horizon, batch) if uniform_kl else None
        return EvalOutput(logp, entropy, values, core_flat.view(steps, batch, -1), rnn_states, kl_t)

    def evaluate_samples(self, obs: Dict[str, torch.Tensor], actions: torch.Tensor, uniform_kl: bool = False):
        """`evaluate` for unordered samples of a feed-forward model: (logp, entropy,
        values, uniform_kl or None), each [N]."""
        if self.core is not None:
            raise ValueError("evaluate_samples needs a model without a GRU core; a recurrent model "
                             "re-runs whole trajectories with evaluate().")
        n = actions.shape[0]
        if actions.shape != (n, self.action_spec.action_dim):
            raise ValueError(f"actions must be [N, {self.action_spec.action_dim}], got {tuple(actions.shape)}.")
        x = self._encode(obs)
        dist = self._distribution(x, obs)
        kl = dist.symmetric_kl_to_uniform() if uniform_kl else None
        return dist.log_prob(actions), dist.entropy(), self._values(obs, x), kl

    def values_with_state(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor) -> torch.Tensor:
        """Values [N] of observations given their GRU states: the bootstrap of
        time-limit-truncated episodes."""
        self._check_inputs(obs, rnn_state)
        if self.critic_encoders is not None:
            return self._values(obs, None)
        core_out, _ = self._core_step(self._encode(obs), rnn_state)
        return self._values(obs, core_out)

    def update_normalizer(self, obs: Dict[str, torch.Tensor], keep: Optional[torch.Tensor] = None,
                          reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
        """Fold a batch {key: [*lead, *shape]} (the rows where keep) into the observation
        statistics; a no-op without normalize_obs. Images contribute at most
        IMAGE_NORM_ROWS random frames, picked before any copy, to keep the cost small."""
        kept = None if keep is None else keep.reshape(-1).nonzero().squeeze(1)
        for key, norm in self._observation_norms():
            if key not in obs:
                raise ValueError(f"update_normalizer needs observation key '{key}', got {sorted(obs)}.")
            rows = obs[key].reshape(-1, *self.layout[key][0])  # a view of a time-major batch
            index = kept
            if self.layout[key][1] == torch.uint8:
                available = rows.shape[0] if index is None else index.numel()
                if available > IMAGE_NORM_ROWS:
                    pick = torch.randperm(available, device=rows.device)[:IMAGE_NORM_ROWS]
                    index = pick if index is None else index[pick]
            norm.update(rows if index is None else rows.index_select(0, index), reduce)

    def _observation_norms(self) -> List[Tuple[str, RunningNorm]]:
        """(key, normaliser) of every observation normaliser: in fastrl's encoders, or in the
        inputs of a registered model's."""
        found = []
        for encoders in (e for e in (self.encoders, self.critic_encoders) if e is not None):
            holders = encoders[0].inputs if self.model else encoders
            found += [(key, h.norm) for key, h in zip(self.obs_keys, holders) if getattr(h, "norm", None) is not None]
        return found


def _float_tensors(model: nn.Module) -> List[torch.Tensor]:
    # Registration order, the same for two models of one config. Integer buffers would
    # not survive float32, so they are left out.
    return [t for t in model.state_dict().values() if t.is_floating_point()]


def flat_state_size(model: nn.Module) -> int:
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



def resolve_device(cfg) -> str:
    """cfg.device, with auto as cuda where present: a planned run has auto replaced by its plan first."""
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def native_bf16() -> bool:
    """Whether this CPU has native bfloat16 (AVX512-BF16 or AMX); without it bf16 is
    emulated and not worth timing."""
    return any(getattr(torch.cpu, probe, lambda: False)()
               for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def has_images(obs_space: gym.Space) -> bool:
    """Whether the model has an image encoder, the only part --precision changes."""
    return any(dtype == torch.uint8 for _, dtype in obs_layout(obs_space).values())


class Precision(NamedTuple):
    """Image-encoder arithmetic ("fp32" or "bf16") per role, and why. Acting and
    learning choose apart: small and large batches run different kernels."""

    acting: str
    learning: str
    why: str

    def describe(self) -> str:
        if self.acting == self.learning:
            return f"precision: {self.acting} ({self.why})"
        return f"precision: acting {self.acting}, learning {self.learning} ({self.why})"


def build_model(cfg, obs_space, action_space, precision: str = "fp32") -> ActorCritic:
    """The network of `cfg`, its image encoders in `precision` (one role's choice).
    Precision changes no weight, so a model built for its weights keeps the default."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"build_model takes precision fp32 or bf16, not {precision!r}; "
                         "resolve --precision auto first (fastrl.tuning.precision).")
    return ActorCritic(obs_space, action_space, ModelSpec(
        hidden_sizes=cfg.hidden_size_tuple, use_rnn=cfg.use_rnn, rnn_size=cfg.rnn_size, activation=cfg.activation,
        normalize_obs=cfg.normalize_obs, separate_critic=cfg.separate_critic, conv_bf16=precision == "bf16",
        normalize_returns=cfg.normalize_returns, encoder_init_gain=cfg.encoder_init_gain,
        policy_init_gain=cfg.policy_init_gain, conv_stack=cfg.conv_stack, conv_activation=cfg.conv_activation,
        model=cfg.model, log_std_init=cfg.log_std_init))
