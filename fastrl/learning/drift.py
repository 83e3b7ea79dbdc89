"""Warnings for a run whose learning drifts somewhere it rarely comes back from: the
loss stats often say so long before the return does, and a return that gives back its
rise is said where they did not. Each warning is said once when its condition starts,
and again only after it has cleared; the return's, only after a new best, as a run
that swings about its fallen level would cross the line at every swing.
"""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence

# The entropy has fallen to this fraction of the highest value seen in the run: the
# policy is close to deterministic, and an entropy bonus pulls less the lower it goes.
ENTROPY_COLLAPSE_FRACTION = 0.1
# Continuous actions: a Gaussian's entropy has no zero to be a fraction of (it is
# negative below a std of 0.24, and 10% of its value at std 1 is a std of 0.28, a
# healthy MuJoCo policy's), so there the actions' noise is judged: its std (geometric
# mean over the dimensions) fell to this fraction of its peak.
STD_COLLAPSE_FRACTION = 0.1
_HALF_LOG_2PI_E = 0.5 * math.log(2 * math.pi * math.e)  # a unit Gaussian's entropy per dimension
# Approximate KL per update: PPO-style updates sit near 0.01-0.02, and runs that
# collapsed showed several times that. Single spikes happen in healthy runs, so warn
# only when it stays high for KL_TOO_LARGE_REPORTS reports.
KL_TOO_LARGE = 0.05
KL_TOO_LARGE_REPORTS = 3
# The value function explains less than nothing of its targets, this many reports running.
EV_NEGATIVE_REPORTS = 6
# The 100-episode mean has given back this fraction of its rise (from its first full
# window to its best) and this many standard errors of the window's mean, this many
# reports running: the policy is unlearning. A healthy run's moving mean dips less, for
# a report or two; Hopper-v5's falls at a constant rate are what it catches
# (benchmarks/learning_suite.py, largest_fall). The standard errors keep a resumed or
# plateaued run, whose rise is small beside its noise, from warning on noise.
RETURN_FALL_FRACTION = 0.3
RETURN_FALL_STANDARD_ERRORS = 3.0
RETURN_FALL_REPORTS = 6


def gaussian_std(entropy: float, dims: int) -> float:
    """The geometric-mean std of a diagonal Gaussian of `dims` dimensions with this entropy."""
    return math.exp(entropy / dims - _HALF_LOG_2PI_E)


class DriftWatch:
    """`gaussian_dims`: the action dimensions where the actions are one diagonal Gaussian
    (a Box), whose collapse is judged on its std; 0 for discrete and mixed actions.
    `lr_schedule`, `target_kl` and `evaluating` (whether --eval_every_frames keeps a best
    checkpoint) pick the advice for a return that falls back."""

    def __init__(self, exploration_loss: str = "entropy", gaussian_dims: int = 0, lr_schedule: str = "constant",
                 target_kl: float = 0.0, evaluating: bool = False):
        # Under the KL-to-uniform term a low entropy is an equilibrium, not a collapse
        # (its pull on a dying action stays), so warn of collapse only under the
        # entropy bonus, whose pull fades.
        self._watch_entropy = exploration_loss == "entropy"
        self._gaussian_dims = gaussian_dims
        self._entropy_peak = -math.inf
        self._ev_negative_for = 0
        self._kl_large_for = 0
        self._lr_schedule = lr_schedule
        self._target_kl = target_kl
        self._evaluating = evaluating
        self._first_return: Optional[float] = None
        self._best_return = -math.inf
        self._return_fallen_for = 0
        self._fall_said_at_best = -math.inf
        self._active: set = set()

    def check(self, metrics: Dict[str, float], full_window: Optional[Sequence[float]] = None) -> List[str]:
        """New warnings for the learner's latest stats and the returns of the last 100
        episodes (None until 100 have ended); empty when nothing started."""
        now = {}
        entropy = metrics.get("entropy")
        if self._watch_entropy and entropy is not None and math.isfinite(entropy):
            self._entropy_peak = max(self._entropy_peak, entropy)
            collapse = self._std_collapse(entropy) if self._gaussian_dims else self._entropy_collapse(entropy)
            if collapse:
                now["entropy"] = collapse
        kl = metrics.get("approx_kl")
        if kl is not None and math.isfinite(kl):
            self._kl_large_for = self._kl_large_for + 1 if kl > KL_TOO_LARGE else 0
            if self._kl_large_for >= KL_TOO_LARGE_REPORTS:
                now["kl"] = (f"approximate KL per update has been over {KL_TOO_LARGE} for {self._kl_large_for} reports "
                             f"(now {kl:.3g}): each update moves the policy far from the one that acted; try a lower "
                             "--lr (or fewer --ppo_epochs)")
        ev = metrics.get("explained_variance")
        if ev is not None and math.isfinite(ev):
            self._ev_negative_for = self._ev_negative_for + 1 if ev < 0 else 0
            if self._ev_negative_for >= EV_NEGATIVE_REPORTS:
                now["ev"] = (f"the value function's explained variance has been negative for {self._ev_negative_for} "
                             "reports: its advantages are noise; check the rewards' scale "
                             "(--reward_scale, --normalize_returns) and --gamma")
        fall = self._return_fall(full_window) if full_window else ""
        if fall:
            now["return"] = fall
        started = [text for key, text in now.items() if key not in self._active]
        self._active = set(now)
        return started

    def _entropy_collapse(self, entropy: float) -> str:
        if not (self._entropy_peak > 0 and entropy < ENTROPY_COLLAPSE_FRACTION * self._entropy_peak):
            return ""
        return (f"policy entropy fell to {entropy:.3g}, under {ENTROPY_COLLAPSE_FRACTION:.0%} of its peak "
                f"{self._entropy_peak:.3g}: the policy is nearly deterministic and may stop exploring; "
                "try a larger --entropy_coef or --exploration_loss symmetric_kl")

    def _std_collapse(self, entropy: float) -> str:
        std, peak = (gaussian_std(h, self._gaussian_dims) for h in (entropy, self._entropy_peak))
        if std >= STD_COLLAPSE_FRACTION * peak:
            return ""
        return (f"the actions' noise fell to a std of {std:.3g}, under {STD_COLLAPSE_FRACTION:.0%} of its peak "
                f"{peak:.3g}: the policy is nearly deterministic and may stop exploring; try a larger "
                "--entropy_coef")

    def _return_fall(self, returns: Sequence[float]) -> str:
        mean = statistics.fmean(returns)
        if not math.isfinite(mean):
            return ""
        if self._first_return is None:
            self._first_return = mean
        self._best_return = max(self._best_return, mean)
        rise, fall = self._best_return - self._first_return, self._best_return - mean
        noise = RETURN_FALL_STANDARD_ERRORS * statistics.pstdev(returns) / math.sqrt(len(returns))
        fallen = rise > 0 and fall >= RETURN_FALL_FRACTION * rise and fall > noise
        self._return_fallen_for = self._return_fallen_for + 1 if fallen else 0
        if self._return_fallen_for < RETURN_FALL_REPORTS or self._best_return <= self._fall_said_at_best:
            return ""
        self._fall_said_at_best = self._best_return
        given_back = fall / rise
        rate = ("--lr_schedule linear with a --train_for_env_frames or --train_for_seconds budget (the rate reaches 0 "
                "at its end)" if self._lr_schedule == "constant" else "a smaller --lr")
        # No tighter brake for a run that has one: Hopper-v5's falls build over hundreds of
        # updates each within the brake, and went on at half its --target_kl (benchmarks/learning_suite.py).
        brake = ("" if self._target_kl > 0
                 else ", or --target_kl 0.01 (a batch's passes end once the policy moved that far)")
        # Hopper-v5's deterministic evaluations fall with its training returns: whatever the
        # schedule, only an evaluator keeps the best policy.
        best = ("the best evaluated policy stays in checkpoints/best.pt" if self._evaluating else
                "--eval_every_frames keeps the best policy it sees in checkpoints/best.pt")
        return (f"the 100-episode mean return fell to {_number(mean)}, giving back {given_back:.0%} of its rise to "
                f"its best {_number(self._best_return)}: the policy is unlearning; try {rate}{brake}; {best}")


def _number(value: float) -> str:
    """A return, short: whole numbers from 100 up."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
