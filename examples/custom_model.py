"""Train fastrl with a network encoder of your own: residual blocks with layer norm.

    python examples/custom_model.py                       # a few seconds on CartPole-v1
    python examples/custom_model.py --env LunarLander-v3  # any fastrl.train option works too

fastrl keeps its own parts around the encoder: the GRU core (--use_rnn), the policy and
value heads, the action distributions, the observation and return normalisers, --precision,
checkpoints and the compiled paths. The model is registered at the top level of this file,
so that fastrl's worker processes, which import it again, find it too.
"""
import sys

import numpy as np
import torch
import torch.nn as nn

import fastrl


class ResidualMLP(nn.Module):
    """A vector observation -> a linear layer to `width` -> `blocks` residual blocks
    (layer norm, linear, tanh) -> features [N, width]."""

    def __init__(self, in_dim: int, width: int, blocks: int):
        super().__init__()
        self.project = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Tanh())
                                    for _ in range(blocks))
        self.out_dim = width  # the features' width, which fastrl checks when it builds the model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.project(x.flatten(1))
        for block in self.blocks:
            h = h + block(h)
        return torch.tanh(h)


def build_encoder(obs_space, spec) -> nn.Module:
    """The builder fastrl calls: the observation space and the run's ModelSpec (here its
    --hidden_sizes sets the width) in, the encoder out."""
    return ResidualMLP(int(np.prod(obs_space.shape)), width=spec.hidden_sizes[-1], blocks=2)


fastrl.register_model("residual_mlp", build_encoder)


if __name__ == "__main__":
    from fastrl.train import main

    # A tiny budget; options given after this file's name are added, and win.
    sys.exit(main(["--env", "CartPole-v1", "--model", "residual_mlp", "--experiment", "residual_mlp",
                   "--train_for_env_frames", "30000", *sys.argv[1:]]))
