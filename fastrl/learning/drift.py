"""Warnings for a run whose learning is drifting somewhere it rarely comes back from.

The learner's loss stats say why learning stalls long before the return does, but
only to someone who opens TensorBoard. `DriftWatch` reads them at every status line
and says it in words, once when a condition starts (and again only after it has
cleared), so a console that prints a line every few seconds is not flooded.
"""
from __future__ import annotations

import math
from typing import Dict, List

# The entropy has fallen to this fraction of the highest value seen in the run: the
# policy is close to deterministic, and an entropy bonus pulls less the lower it goes.
ENTROPY_COLLAPSE_FRACTION = 0.1
# Approximate KL between the acting and the updated policy per update. PPO-style
# updates behave at ~0.01-0.02. Measured on LunarLander-v3 with the classic-control
# defaults: 0.067 (clip fraction 0.30) at the return's peak of 168, just before it
# fell to -150; so warn well below that. But only when it stays there: at --lr 2e-3
# LunarLander's KL has a median of 0.016-0.017 and single reports of 0.1-0.3 (2-3% of
# them) on runs that reach 200 and stay, with never 3 reports over 0.05 in a row
# (benchmarks/README.md, twentieth session).
KL_TOO_LARGE = 0.05
KL_TOO_LARGE_REPORTS = 3
# The value function explains less than nothing of its targets, this many reports running.
EV_NEGATIVE_REPORTS = 6


class DriftWatch:
    def __init__(self, exploration_loss: str = "entropy"):
        # Under the KL-to-uniform term a low entropy is where the term balances the
        # return, not a fall it cannot pull back from: its pull on a dying action's
        # logit stays at least 1/n (tests/test_distributions.py), and a solved task
        # like doom_basic sits at 0.02-0.13 nats for a whole run. So the collapse is
        # worth a warning only under the entropy bonus, whose pull fades with p.
        self._watch_entropy = exploration_loss == "entropy"
        self._entropy_peak = -math.inf
        self._ev_negative_for = 0
        self._kl_large_for = 0
        self._active: set = set()

    def check(self, metrics: Dict[str, float]) -> List[str]:
        """New warnings for the learner's latest stats (empty when nothing started)."""
        now = {}
        entropy = metrics.get("entropy")
        if self._watch_entropy and entropy is not None and math.isfinite(entropy):
            self._entropy_peak = max(self._entropy_peak, entropy)
            if self._entropy_peak > 0 and entropy < ENTROPY_COLLAPSE_FRACTION * self._entropy_peak:
                now["entropy"] = (
                    f"policy entropy fell to {entropy:.3g}, under {ENTROPY_COLLAPSE_FRACTION:.0%} of its peak "
                    f"{self._entropy_peak:.3g}: the policy is nearly deterministic and may stop exploring; "
                    "try a larger --entropy_coef or --exploration_loss symmetric_kl")
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
        started = [text for key, text in now.items() if key not in self._active]
        self._active = set(now)
        return started
