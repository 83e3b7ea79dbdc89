"""Adam for the learner: torch's fused Adam kernel, called without torch.optim, whose
wrapped methods import torch._dynamo on first call (a second before the first
trained batch). The fused kernel also updates all weights in one pass, where the
default CPU update goes one tensor and op at a time. The state and `state_dict()`
keep torch.optim.Adam's layout, so checkpoints load either way (tests/test_adam.py).
"""
from __future__ import annotations

from typing import Iterable

import torch

BETAS = (0.9, 0.999)


class FusedAdam:
    """Adam (no weight decay, no AMSGrad) over one parameter group, with what the
    learner uses: `step`, `zero_grad`, the state-dict pair, `param_groups[0]["lr"]`
    and `state` (which PBT clears)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, eps: float = 1e-8, betas=BETAS):
        self.params = list(params)
        if not self.params:
            raise ValueError("FusedAdam got no parameters: pass the model's parameters().")
        # torch.optim.Adam's group keys, so the state_dict it writes is one torch loads.
        self.param_groups = [{"params": self.params, "lr": float(lr), "betas": tuple(betas), "eps": float(eps),
                              "weight_decay": 0.0, "amsgrad": False, "maximize": False, "foreach": None,
                              "capturable": False, "differentiable": False, "fused": True,
                              "decoupled_weight_decay": False}]
        self.state: dict = {}  # parameter -> {"step", "exp_avg", "exp_avg_sq"}, made at its first step

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def _moments(self, p: torch.Tensor) -> dict:
        state = self.state.get(p)
        if state is None:
            # The fused kernel reads the step count from a float32 tensor beside the weights.
            state = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        # The kernel takes tensors of one device and dtype per call.
        by_kind: dict = {}
        for p in self.params:
            if p.grad is None:
                continue
            state = self._moments(p)
            lists = by_kind.setdefault((p.device, p.dtype), ([], [], [], [], []))
            for column, tensor in zip(lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])):
                column.append(tensor)
        for params, grads, exp_avgs, exp_avg_sqs, steps in by_kind.values():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=group["lr"], beta1=beta1,
                               beta2=beta2, weight_decay=0.0, eps=group["eps"], amsgrad=False, maximize=False)

    def state_dict(self) -> dict:
        """torch.optim.Adam's layout: each parameter's state by its index."""
        index = {p: i for i, p in enumerate(self.params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"state": {index[p]: dict(s) for p, s in self.state.items()},
                "param_groups": [{**group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, saved: dict) -> None:
        """Take a state written by this class or by torch.optim.Adam (any of its
        implementations) for the same parameters in the same order."""
        groups = saved.get("param_groups", [])
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"the saved optimizer state is for {sum(len(g['params']) for g in groups)} parameters "
                             f"in {len(groups)} groups, this model has {len(self.params)} in 1: it was saved "
                             "for another model; start the run afresh or point it at its own checkpoint.")
        for key in ("lr", "betas", "eps"):
            self.param_groups[0][key] = groups[0][key]
        self.state = {}
        for i, state in saved["state"].items():
            p = self.params[groups[0]["params"].index(int(i))]
            self.state[p] = {"step": torch.as_tensor(state["step"], dtype=torch.float32).to(p.device).reshape(()),
                             "exp_avg": state["exp_avg"].to(p.device, p.dtype),
                             "exp_avg_sq": state["exp_avg_sq"].to(p.device, p.dtype)}
