"""Action spaces as policy-head layouts, storage and distributions.

Actions are stored as one tensor [B, action_dim] of one dtype, so buffers need no
per-space layout: discrete ones zero-based (`to_env` adds the space's start),
continuous ones unclipped as sampled, so their log-probabilities stay exact.

The categorical product skips torch.distributions, whose per-component construction
and validation dominate at inference batch sizes: it takes one log_softmax per run
of equal-sized components. Padding all components to the widest is slower at
learner batch sizes.

Discrete actions can be masked, gymnasium's way: an `action_mask` entry of the
observation, 1 where an action is allowed, one row of every component's actions in
order. A masked action gets probability exactly 0, and the entropy and the KL to
uniform count the allowed actions only.
"""

import math
from abc import ABC, abstractmethod
from typing import List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

SUPPORTED_SPACES = "Discrete, MultiDiscrete, Tuple of Discrete, Box"
ACTION_MASK_KEY = "action_mask"  # the Dict observation entry that masks discrete actions

# Keeps std away from 0 (log_prob blows up) and from huge values; bites only when
# optimisation has gone wrong.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class CategoricalProduct:
    """Independent categoricals over the columns of an int64 action tensor; logits
    [B, sum(sizes)], with `runs` (count, size) of consecutive equal-sized components."""

    def __init__(self, logits: torch.Tensor, runs: Sequence[Tuple[int, int]], mask: Optional[torch.Tensor] = None):
        """mask: bool [B, sum(sizes)], True where an action is allowed; None allows all."""
        batch = logits.shape[0]
        widths = [count * size for count, size in runs]
        if mask is not None:
            # The most negative finite logit rather than -inf: the action's probability is
            # exactly 0, yet p * log p and every gradient stay finite (0 * -inf is nan), and
            # a row with nothing allowed is uniform instead of nan. where() passes no
            # gradient to a masked logit.
            logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
        self._log_probs: List[torch.Tensor] = [
            F.log_softmax(chunk.reshape(batch, count, size), dim=-1)
            for chunk, (count, size) in zip(logits.split(widths, dim=-1), runs)
        ]
        self._allowed: Optional[List[torch.Tensor]] = None if mask is None else [
            chunk.reshape(batch, count, size) for chunk, (count, size) in zip(mask.split(widths, dim=-1), runs)]
        self._counts = [count for count, _ in runs]

    def sample(self) -> torch.Tensor:
        """Random actions, int64 [B, num_components], by inverse CDF. torch.multinomial
        checks its input on the host, which a CUDA graph cannot record. The draw u lies in
        (0, total], never 0, so the first action whose cdf reaches it has probability > 0:
        a masked action is never picked; the clamp covers a last sum rounded just under 1."""
        picks = []
        for log_p in self._log_probs:
            batch, count, size = log_p.shape
            cdf = log_p.float().exp().cumsum(dim=-1)
            u_t = (1.0 - torch.rand(batch, count, 1, dtype=cdf.dtype, device=cdf.device)) * cdf[..., -1:]
            picks.append((cdf < u_t).sum(dim=-1).clamp_max(size - 1))
        return torch.cat(picks, dim=1)

    def mode(self) -> torch.Tensor:
        """Most likely action per component (argmax), int64 [B, num_components]."""
        return torch.cat([log_p.argmax(dim=-1) for log_p in self._log_probs], dim=1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Joint log-probability [B] of int64 actions [B, num_components]."""
        total = 0.0
        for log_p, cols in zip(self._log_probs, actions.split(self._counts, dim=1)):
            total = total + log_p.gather(-1, cols.unsqueeze(-1)).sum(dim=(1, 2))
        return total

    def entropy(self) -> torch.Tensor:
        total = 0.0
        for log_p in self._log_probs:
            total = total - (log_p.exp() * log_p).sum(dim=(1, 2))
        return total

    def symmetric_kl_to_uniform(self) -> torch.Tensor:
        """KL(p || u) + KL(u || p) [B] to the uniform policy, summed over components.

        Unlike the entropy, whose gradient vanishes as p turns deterministic, its pull
        on a vanishing action's logit stays at -1/n: it brings a collapsed policy back.
        Not capped: a cap would zero exactly that gradient, and the gradient per logit
        is bounded anyway.
        With a mask the uniform policy is over the allowed actions.
        """
        total = 0.0
        for i, log_p in enumerate(self._log_probs):
            if self._allowed is None:
                mean_log_p = log_p.sum(-1) / log_p.shape[-1]
            else:
                allowed = self._allowed[i]
                mean_log_p = (log_p * allowed).sum(-1) / allowed.sum(-1).clamp(min=1)
            total = total + ((log_p.exp() * log_p).sum(-1) - mean_log_p).sum(-1)
        return total


class DiagGaussian:
    """Independent normals with a batch of means and one shared log-std vector."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean
        self.log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).expand_as(mean)
        self.std = self.log_std.exp()

    def sample(self) -> torch.Tensor:
        """Random actions, float32 [B, action_dim] (unclipped, not differentiable)."""
        with torch.no_grad():
            return self.mean + self.std * torch.randn_like(self.mean)

    def mode(self) -> torch.Tensor:
        return self.mean

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Joint log-density [B] of actions [B, action_dim]."""
        z = (actions - self.mean) / self.std
        return (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(dim=-1)

    def entropy(self) -> torch.Tensor:
        return (0.5 + _HALF_LOG_2PI + self.log_std).sum(dim=-1)


class ActionSpec(ABC):
    """How one action space maps to the policy head (num_params wide), storage
    (action_dim columns of dtype) and the env. is_continuous: the model owns a
    log-std [action_dim] and passes it to `distribution`."""

    num_params: int
    action_dim: int
    dtype: torch.dtype
    is_continuous: bool

    @staticmethod
    def from_space(space: gym.Space) -> "ActionSpec":
        """The spec of a gymnasium action space; ValueError if unsupported."""
        if isinstance(space, gym.spaces.Discrete):
            return CategoricalSpec([int(space.n)], "discrete", [int(space.start)])
        if isinstance(space, gym.spaces.MultiDiscrete):
            return CategoricalSpec(
                [int(n) for n in space.nvec.reshape(-1)],
                "multi_discrete",
                [int(s) for s in space.start.reshape(-1)],
                env_shape=space.nvec.shape,
            )
        if isinstance(space, gym.spaces.Tuple):
            if space.spaces and all(isinstance(s, gym.spaces.Discrete) for s in space.spaces):
                return CategoricalSpec(
                    [int(s.n) for s in space.spaces], "tuple", [int(s.start) for s in space.spaces]
                )
            raise ValueError(
                f"Unsupported action space {space}: a Tuple action space must hold only "
                f"Discrete spaces (supported: {SUPPORTED_SPACES}); use MultiDiscrete or "
                f"flatten the action space in an env wrapper."
            )
        if isinstance(space, gym.spaces.Box):
            return GaussianSpec(space)
        raise ValueError(
            f"Unsupported action space {space}; supported: {SUPPORTED_SPACES}. Wrap the "
            f"env so that its action space is one of these."
        )

    @abstractmethod
    def distribution(self, params: torch.Tensor, log_std: Optional[torch.Tensor] = None,
                     mask: Optional[torch.Tensor] = None):
        """The distribution for policy-head output [B, num_params]; log_std only for Box,
        mask (bool [B, num_params], True = allowed) only for discrete actions.
        It has sample(), mode(), log_prob(actions) [B] and entropy() [B]."""

    @abstractmethod
    def check_mask_shape(self, shape: Tuple[int, ...]) -> None:
        """Refuse, in a sentence, an action_mask observation of per-sample `shape` that does not fit."""

    @abstractmethod
    def to_env(self, action_row: np.ndarray):
        """Convert one stored action row [action_dim] into what env.step expects."""

    def _check_params(self, params: torch.Tensor) -> None:
        if params.dim() != 2 or params.shape[1] != self.num_params:
            raise ValueError(
                f"distribution() expects policy-head output of shape [B, {self.num_params}], "
                f"got {tuple(params.shape)}; flatten leading batch dims before calling it."
            )


class CategoricalSpec(ActionSpec):
    """Discrete, MultiDiscrete and Tuple-of-Discrete: a product of categoricals. kind
    picks what the env gets: an int, an int64 array of env_shape, or a tuple of ints."""

    def __init__(self, sizes: List[int], kind: str, starts: List[int], env_shape=None):
        if any(n < 1 for n in sizes):
            raise ValueError(f"Every discrete action component needs n >= 1, got sizes {sizes}.")
        self.sizes = sizes
        self.kind = kind
        self.num_params = sum(sizes)
        self.action_dim = len(sizes)
        self.dtype = torch.int64
        self.is_continuous = False
        self._starts = np.asarray(starts, dtype=np.int64)
        self._env_shape = env_shape
        self._runs: List[Tuple[int, int]] = []
        for n in sizes:
            if self._runs and self._runs[-1][1] == n:
                self._runs[-1] = (self._runs[-1][0] + 1, n)
            else:
                self._runs.append((1, n))

    def distribution(self, params: torch.Tensor, log_std: Optional[torch.Tensor] = None,
                     mask: Optional[torch.Tensor] = None):
        self._check_params(params)
        if log_std is not None:
            raise ValueError("Discrete action spaces have no log-std; pass log_std=None.")
        if mask is not None and (mask.shape != params.shape or mask.dtype != torch.bool):
            raise ValueError(f"distribution() expects a bool mask of the logits' shape {tuple(params.shape)}, "
                             f"got {mask.dtype} {tuple(mask.shape)}.")
        return CategoricalProduct(params, self._runs, mask)

    def mask_shapes(self) -> List[Tuple[int, ...]]:
        """The per-sample shapes an action_mask may have: every component's actions in
        one row, or, where all components have n actions, one row of n per component."""
        shapes = [(self.num_params,)]
        if self.action_dim > 1 and len(set(self.sizes)) == 1:
            components = tuple(self._env_shape) if self._env_shape is not None else (self.action_dim,)
            shapes.append((*components, self.sizes[0]))
        return list(dict.fromkeys(shapes))

    def check_mask_shape(self, shape: Tuple[int, ...]) -> None:
        accepted = self.mask_shapes()
        if tuple(shape) not in accepted:
            wanted = " or ".join(str(s) for s in accepted)
            actions = (f"{self.sizes[0]} actions" if self.action_dim == 1
                       else f"{self.action_dim} components of {self.sizes} actions, component after component")
            raise ValueError(f"The observation's {ACTION_MASK_KEY!r} has shape {tuple(shape)}, but the action "
                             f"space needs {wanted}: one 0/1 for each of its {actions}.")

    def fully_masked(self, mask: torch.Tensor) -> Optional[Tuple[int, int]]:
        """The first (row, component) of bool `mask` [B, num_params] that allows no
        action, or None. One host sync: for CPU tensors (actors, the env side)."""
        offset = 0
        blocked = []
        for count, size in self._runs:
            chunk = mask[:, offset:offset + count * size].reshape(mask.shape[0], count, size)
            blocked.append(~chunk.any(dim=-1))
            offset += count * size
        blocked = torch.cat(blocked, dim=1)
        if not bool(blocked.any()):
            return None
        row, component = (int(i) for i in blocked.nonzero()[0])
        return row, component

    def nothing_allowed(self, whose: str, component: int) -> str:
        """The sentence for a mask (`whose`, its subject) that allows no action of `component`."""
        which = f" of action component {component}" if self.action_dim > 1 else ""
        return (f"{whose} allows no action{which}; an env must leave at least one action allowed at every "
                "step (end the episode instead).")

    def random_allowed_action(self, mask: np.ndarray, rng: np.random.Generator):
        """A uniformly random action for env.step among those an action_mask allows:
        action_space.sample() with the mask applied."""
        row, offset, flat = np.zeros(self.action_dim, dtype=np.int64), 0, np.asarray(mask).reshape(-1)
        for i, n in enumerate(self.sizes):
            allowed = np.flatnonzero(flat[offset:offset + n])
            if not len(allowed):
                raise ValueError(self.nothing_allowed(f"The env's {ACTION_MASK_KEY!r}", i))
            row[i] = allowed[rng.integers(len(allowed))]
            offset += n
        return self.to_env(row)

    def to_env(self, action_row: np.ndarray):
        """int (Discrete), np.int64 array (MultiDiscrete) or tuple of ints (Tuple)."""
        if self.kind == "discrete":
            return int(action_row[0]) + int(self._starts[0])
        shifted = np.asarray(action_row, dtype=np.int64) + self._starts
        if self.kind == "multi_discrete":
            return shifted.reshape(self._env_shape)
        return tuple(int(a) for a in shifted)


class GaussianSpec(ActionSpec):
    """Box: a diagonal Gaussian with a learned state-independent log-std.

    On bounded dimensions the mean is centre + half-width * tanh(param). The env clips
    what is drawn, so an unbounded mean can drift far past a bound where every draw
    clips to the same action, no advantage says which way is better, and nothing
    brings it back.
    """

    def __init__(self, space: gym.spaces.Box):
        self.action_dim = int(np.prod(space.shape, dtype=np.int64))
        if self.action_dim < 1:
            raise ValueError(f"Box action space {space} has no dimensions; give it shape (n,).")
        self.num_params = self.action_dim
        self.dtype = torch.float32
        self.is_continuous = True
        self._shape = space.shape
        self._low = space.low.reshape(-1).astype(np.float32)
        self._high = space.high.reshape(-1).astype(np.float32)
        bounded = np.isfinite(self._low) & np.isfinite(self._high)
        self._bounded = torch.as_tensor(bounded)
        self._centre = torch.as_tensor(np.where(bounded, (self._low + self._high) / 2, 0.0), dtype=torch.float32)
        self._half_width = torch.as_tensor(np.where(bounded, (self._high - self._low) / 2, 1.0), dtype=torch.float32)

    def start_log_std(self, log_std_init: float) -> torch.Tensor:
        """[action_dim] log-stds of exp(log_std_init) half-widths on bounded dimensions (and
        of exp(log_std_init) elsewhere): one setting suits a [-2, 2] torque and a [-0.4, 0.4] one."""
        return float(log_std_init) + torch.log(self._half_width.cpu())

    def mean(self, params: torch.Tensor) -> torch.Tensor:
        """The Gaussian's mean for `params` [B, action_dim]: inside the bounds where there are some."""
        centre, half_width, is_bounded = self._constants(params.device)
        bounded = centre + half_width * torch.tanh(params)
        return torch.where(is_bounded, bounded.to(params.dtype), params)

    def _constants(self, dev: torch.device) -> tuple:
        """The bounds' tensors, moved to `dev` once: a host-to-GPU copy per call would
        block each step and cannot be recorded in a CUDA graph."""
        if self._centre.device != dev:
            self._bounded, self._centre, self._half_width = (
                t.to(dev) for t in (self._bounded, self._centre, self._half_width))
        return self._centre, self._half_width, self._bounded

    def distribution(self, params: torch.Tensor, log_std: Optional[torch.Tensor] = None,
                     mask: Optional[torch.Tensor] = None):
        self._check_params(params)
        if mask is not None:
            self.check_mask_shape(tuple(mask.shape[1:]))  # refuses: a Box has no actions to mask
        if log_std is None or log_std.shape != (self.action_dim,):
            raise ValueError(
                f"Box action spaces need the model's log-std of shape ({self.action_dim},), "
                f"got {None if log_std is None else tuple(log_std.shape)}."
            )
        return DiagGaussian(self.mean(params), log_std)

    def check_mask_shape(self, shape: Tuple[int, ...]) -> None:
        raise ValueError(f"The observation's {ACTION_MASK_KEY!r} masks discrete actions, but the action space "
                         f"is continuous (Box); drop the mask from the observation.")

    def to_env(self, action_row: np.ndarray) -> np.ndarray:
        """float32 array of the space's shape, clipped to its bounds."""
        clipped = np.clip(np.asarray(action_row, dtype=np.float32), self._low, self._high)
        return clipped.reshape(self._shape)


def random_allowed_action(action_space: gym.Space, obs):
    """action_space.sample(), kept to the actions allowed by the action mask of a Dict
    observation `obs` where it carries one: start-up's and the env split's random steps
    must not take actions a masked env forbids."""
    if isinstance(obs, dict) and ACTION_MASK_KEY in obs:
        spec = ActionSpec.from_space(action_space)
        if isinstance(spec, CategoricalSpec):
            return spec.random_allowed_action(obs[ACTION_MASK_KEY], action_space.np_random)
    return action_space.sample()
