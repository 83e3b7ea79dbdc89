"""The learner's batch plumbing: a gathered batch, split into minibatch columns,
keeps its images channels-last and bootstraps each truncated step from that
step's own final observation."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.algo.model import ActorCritic, ModelSpec, obs_layout
from fastrl.learning.learner import _columns, final_values
from fastrl.plumbing.buffers import TrajectoryBuffers

OBS_SPACE = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
                             "measurements": gym.spaces.Box(-1, 1, (2,), np.float32)})
T, N_ENVS, H = 5, 3, 8


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def _filled_buffers():
    buffers = TrajectoryBuffers(num_buffers=3, rollout=T, envs_per_split=N_ENVS, obs_layout=obs_layout(OBS_SPACE),
                                action_dim=1, action_dtype=torch.int64, rnn_size=H)
    for tensors in (buffers.obs, buffers.final_obs):
        tensors["image"].copy_(torch.randint(0, 256, tensors["image"].shape, dtype=torch.uint8))
        tensors["measurements"].copy_(torch.rand(tensors["measurements"].shape))
    buffers.rnn_state0.copy_(torch.randn(buffers.rnn_state0.shape))
    for buf, t, env in ((2, 1, 0), (2, 4, 2), (0, 3, 1)):
        buffers.truncated[buf, t, env] = True
    return buffers


@pytest.mark.parametrize("cols", [None, [4, 0, 3]], ids=["whole batch", "a minibatch of columns"])
def test_truncated_steps_bootstrap_from_their_own_final_obs(cols):
    buffers = _filled_buffers()
    model = ActorCritic(OBS_SPACE, gym.spaces.Discrete(2), ModelSpec(use_rnn=True, rnn_size=H))
    batch = buffers.gather([2, 0])  # columns 0-2: buffer 2's envs, 3-5: buffer 0's
    if cols is not None:
        batch = _columns(batch, torch.tensor(cols))
    assert batch["obs"]["image"].flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
    columns = cols or list(range(2 * N_ENVS))
    with torch.no_grad():
        ev = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"])
        v_final = final_values(model, batch, ev)

        expected = torch.zeros_like(v_final)
        for j, col in enumerate(columns):
            buf, env = (2, 0)[col // N_ENVS], col % N_ENVS
            for t in range(T):
                if buffers.truncated[buf, t, env]:
                    obs = {k: v[buf, t, env].unsqueeze(0) for k, v in buffers.final_obs.items()}
                    expected[t, j] = model.values_with_state(obs, ev.rnn_states[t + 1, j].unsqueeze(0))[0]
    assert int((expected != 0).sum()) == (3 if cols is None else 2)
    torch.testing.assert_close(v_final, expected)
