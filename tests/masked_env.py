"""A task that the action mask decides: each step only 2 of the actions are legal,
told by the observation's "action_mask" (gymnasium's convention, int8, 1 = legal).
One of the two pays 1, the other 0, and the "hint" observation (a one-hot) names the
paying one. An illegal action ends the episode with a penalty of -1.

Over EPISODE_STEPS steps a policy that reads the hint and keeps to the mask scores
EPISODE_STEPS; a random legal one EPISODE_STEPS / 2; a random one over all 8 actions
about -0.83 (each step legal with chance 1/4, worth 0.5 then, else -1 and the end).

Every illegal action is also written down, for the tests to fail on: counted in
`illegal_actions` and, where $MASKED_ENV_LOG names a folder, appended as a line to
illegal-<pid>.txt there (the envs of a run live in its worker processes). The
multi-discrete variant has two components of 5 actions, 2 legal in each, each
paying half a point; an illegal pick in either is illegal. Registered as
"masked_env:MaskedChoice-v0" and "masked_env:MaskedChoiceMulti-v0" (tests/ on the
children's PYTHONPATH, as for slow_env).

Two faulty variants are for the checks: "MaskedChoiceWrongMask-v0" declares and
returns a mask one entry short, and "MaskedChoiceDeadEnd-v0" masks every action
from its DEAD_END_STEP-th step on.
"""
import os

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 20
DISCRETE_ACTIONS = 8
MULTI_ACTIONS = (5, 5)
DEAD_END_STEP = 5


class MaskedChoiceEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}  # what fastrl.enjoy makes every env with

    def __init__(self, multi: bool = False, mask_short_by: int = 0, dead_end: bool = False, render_mode=None):
        self.sizes = MULTI_ACTIONS if multi else (DISCRETE_ACTIONS,)
        total = sum(self.sizes)
        self.action_space = gym.spaces.MultiDiscrete(self.sizes) if multi else gym.spaces.Discrete(total)
        self.observation_space = gym.spaces.Dict({
            "hint": gym.spaces.Box(0.0, 1.0, (total,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (total - mask_short_by,), np.int8),
        })
        self.mask_short_by, self.dead_end, self.render_mode = mask_short_by, dead_end, render_mode
        self.illegal_actions = 0

    def _draw(self):
        """Per component, a paying action and a legal decoy, as the observation shows them."""
        total = sum(self.sizes)
        self._good, hint, mask, offset = [], np.zeros(total, np.float32), np.zeros(total, np.int8), 0
        for n in self.sizes:
            good, decoy = self.np_random.choice(n, size=2, replace=False)
            self._good.append(int(good))
            hint[offset + good] = 1.0
            mask[offset + good] = mask[offset + decoy] = 1
            offset += n
        if self.dead_end and self._t >= DEAD_END_STEP:
            mask[:] = 0
        self._mask = mask
        return {"hint": hint, "action_mask": mask[:total - self.mask_short_by].copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action):
        picks = [int(action)] if len(self.sizes) == 1 else [int(a) for a in np.asarray(action).reshape(-1)]
        offsets = np.cumsum((0,) + self.sizes[:-1])
        if not all(self._mask[offset + pick] for offset, pick in zip(offsets, picks)):
            self.illegal_actions += 1
            log_dir = os.environ.get("MASKED_ENV_LOG")
            if log_dir:
                with open(os.path.join(log_dir, f"illegal-{os.getpid()}.txt"), "a") as fh:
                    fh.write(f"action {picks} with mask {self._mask.tolist()}\n")
            return self._draw(), -1.0, True, False, {}
        reward = sum(pick == good for pick, good in zip(picks, self._good)) / len(self.sizes)
        self._t += 1
        return self._draw(), float(reward), False, self._t >= EPISODE_STEPS, {}

    def render(self):
        """The mask as a strip of pixels, white where legal: enough for a video."""
        return np.repeat(self._mask[None, :, None] * 255, 3, axis=2).astype(np.uint8)


gym.register(id="MaskedChoice-v0", entry_point="masked_env:MaskedChoiceEnv")
gym.register(id="MaskedChoiceMulti-v0", entry_point="masked_env:MaskedChoiceEnv", kwargs={"multi": True})
gym.register(id="MaskedChoiceWrongMask-v0", entry_point="masked_env:MaskedChoiceEnv", kwargs={"mask_short_by": 1})
gym.register(id="MaskedChoiceDeadEnd-v0", entry_point="masked_env:MaskedChoiceEnv", kwargs={"dead_end": True})
