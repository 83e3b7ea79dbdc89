"""Return targets for off-policy actor-critic: V-trace (IMPALA) and GAE.

Time-major [T, B] tensors with rlax's names: `v_tm1` are the values of s_0..s_{T-1},
`v_t` of s_1..s_T. Episode ends are expressed through `discount_t` alone (0 on an
episode's last step); a truncation's bootstrap value is folded into the reward by
`bootstrap_truncation`, so V-trace and GAE need no truncation logic.
"""

from typing import NamedTuple

import torch


class VTraceReturns(NamedTuple):
    """V-trace outputs, both [T, B] and detached."""

    vs_tm1: torch.Tensor  # value targets for s_0..s_{T-1}
    pg_advantage_t: torch.Tensor  # advantages for the policy gradient of the actions taken


def check_time_major(**tensors):
    """Raise ValueError unless all given tensors are 2-D with one shared [T, B] shape."""
    (first_name, first), *rest = tensors.items()
    for name, x in tensors.items():
        if x.dim() != 2:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; all inputs must be [T, B] (2-D, time-major).")
    for name, x in rest:
        if x.shape != first.shape:
            raise ValueError(
                f"{first_name} has shape {tuple(first.shape)} but {name} has {tuple(x.shape)}; "
                "all inputs must be [T, B]."
            )


@torch.no_grad()
def bootstrap_truncation(r_t, truncated_t, v_final_t, discount):
    """r_t + discount * truncated_t * v_final_t: a truncated episode's return goes on
    past the cut. Pass truncated_t as 0 where a step also terminated."""
    check_time_major(r_t=r_t, truncated_t=truncated_t, v_final_t=v_final_t)
    return r_t + discount * truncated_t.to(r_t.dtype) * v_final_t


def episode_discounts(terminated_t, truncated_t, discount):
    """discount * (1 - (terminated_t OR truncated_t)): both ends cut the trace, as the
    next stored observation belongs to a new episode."""
    check_time_major(terminated_t=terminated_t, truncated_t=truncated_t)
    dtype = terminated_t.dtype if terminated_t.is_floating_point() else torch.get_default_dtype()
    done_t = (terminated_t != 0) | (truncated_t != 0)
    return discount * (~done_t).to(dtype)


def _backward_accumulate(x_t, coef_t):
    """acc_t = x_t + coef_t * acc_{t+1}, acc_T = 0, as one triangular solve per env
    column: a handful of ops instead of a Python loop of ~100 small ones."""
    steps, batch = x_t.shape
    eye = torch.eye(steps, dtype=x_t.dtype, device=x_t.device).expand(batch, steps, steps)
    system = eye - torch.diag_embed(coef_t.T[:, :-1], offset=1)
    acc = torch.linalg.solve_triangular(system, x_t.T.unsqueeze(-1), upper=True)
    return acc.squeeze(-1).T.contiguous()


@torch.no_grad()
def vtrace(v_tm1, v_t, r_t, discount_t, log_rho_t, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, lambda_=1.0):
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018) with the
    paper's lambda folded into the trace coefficients:

        rho_t = min(rho_bar, pi/mu),  c_t = lambda_ * min(c_bar, pi/mu)
        vs_tm1 - v_tm1 = acc_t,  acc_t = rho_t * (r_t + discount_t * v_t - v_tm1) + discount_t * c_t * acc_{t+1}
        q_t = lambda_ * vs_t + (1 - lambda_) * v_t
        pg_advantage_t = min(pg_rho_bar, pi/mu) * (r_t + discount_t * q_t - v_tm1)

    On policy this is exactly GAE(lambda) and the lambda-returns.
    """
    check_time_major(v_tm1=v_tm1, v_t=v_t, r_t=r_t, discount_t=discount_t, log_rho_t=log_rho_t)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ is {lambda_} but must lie in [0, 1].")
    if pg_rho_bar is None:
        pg_rho_bar = rho_bar
    rho = torch.exp(log_rho_t)
    rho_t = rho.clamp(max=rho_bar)
    c_t = lambda_ * rho.clamp(max=c_bar)
    delta_t = rho_t * (r_t + discount_t * v_t - v_tm1)
    vs_tm1 = v_tm1 + _backward_accumulate(delta_t, discount_t * c_t)
    # At an episode end vs_t[t] is the next episode's target, but discount_t = 0 there.
    vs_t = torch.cat([vs_tm1[1:], v_t[-1:]], dim=0)
    q_t = vs_t if lambda_ == 1.0 else lambda_ * vs_t + (1.0 - lambda_) * v_t
    pg_advantage_t = rho.clamp(max=pg_rho_bar) * (r_t + discount_t * q_t - v_tm1)
    return VTraceReturns(vs_tm1, pg_advantage_t)


@torch.no_grad()
def gae(v_tm1, v_t, r_t, discount_t, lambda_):
    """Generalized advantage estimates (Schulman et al. 2016), detached [T, B]:
    A_t = delta_t + discount_t * lambda_ * A_{t+1}."""
    check_time_major(v_tm1=v_tm1, v_t=v_t, r_t=r_t, discount_t=discount_t)
    delta_t = r_t + discount_t * v_t - v_tm1
    return _backward_accumulate(delta_t, discount_t * lambda_)
