"""benchmarks/experiments/kernel_efficiency.py's kernels: the ones the model runs, each counted
at the FLOPs torch's own flop counter gives the same call."""
import os
import sys

import gymnasium as gym
import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from fastrl.algo.model import build_model
from fastrl.config import parse_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks", "experiments"))
from kernel_efficiency import model_kernels  # noqa: E402  (benchmarks/experiments/ is not a package)


def doom_battle_model():
    cfg, _ = parse_args(["--env", "doom_battle"])
    frames = gym.spaces.Box(0, 255, (3, 72, 128), np.uint8)
    return build_model(cfg, frames, gym.spaces.Discrete(5))


def counted_flops(call) -> int:
    with FlopCounterMode(display=False) as counter:
        call()
    return counter.get_total_flops()


def test_learner_kernels_are_the_models_with_torchs_flop_counts():
    model = doom_battle_model()
    steps, rows = 3, 2
    kernels = model_kernels(model, steps * rows, steps, True, torch.float32, "learner")
    names = [k.name for k in kernels]
    # Frames take no gradient, so the first conv has no input-gradient kernel.
    assert names == [
        "learner conv1 forward", "learner conv1 weight grad",
        "learner conv2 forward", "learner conv2 input grad", "learner conv2 weight grad",
        "learner conv3 forward", "learner conv3 input grad", "learner conv3 weight grad",
        "learner fc forward", "learner fc input grad", "learner fc weight grad",
        "learner gru input forward", "learner gru input input grad", "learner gru input weight grad",
        "learner gru hidden forward x3", "learner gru hidden state grad x3", "learner gru hidden weight grad",
    ]
    for kernel in kernels:
        assert kernel.flops == counted_flops(kernel.call), kernel.name
    # And by hand for the first conv: 17 x 31 outputs of 32 channels, each 3 x 8 x 8 products.
    assert kernels[0].flops == 2 * steps * rows * (17 * 31 * 32) * (3 * 8 * 8)


def test_actor_kernels_are_forwards_only():
    model = doom_battle_model()
    kernels = model_kernels(model, 4, 1, False, torch.float32, "actor")
    assert [k.name for k in kernels] == ["actor conv1 forward", "actor conv2 forward", "actor conv3 forward",
                                         "actor fc forward", "actor gru input forward", "actor gru hidden forward"]
    for kernel in kernels:
        assert kernel.flops == counted_flops(kernel.call), kernel.name
