"""Return targets for off-policy actor-critic: V-trace (IMPALA) and GAE.

Pure tensor functions, time-major: every per-step input is [T, B]. Names follow
rlax: `v_tm1` holds the values of s_0..s_{T-1}, `v_t` those of s_1..s_T, and
`r_t`, `discount_t`, `log_rho_t` belong to the transition s_t -> s_{t+1}.

Episode ends inside a rollout are expressed through `discount_t` alone: it is 0
on the last step of an episode, so nothing flows across the boundary. A
time-limit truncation still deserves the value of the state it stopped in; that
value is folded into the reward by `bootstrap_truncation`, which keeps V-trace
and GAE free of any truncation logic.
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
    """Complete the reward of time-limit-truncated steps with the final state's value.

        r'_t = r_t + discount * truncated_t * v_final_t

    Truncation means the episode did not really end, so the return continues past
    the cut and is estimated by V(s_final). Termination gets nothing: pass
    `truncated_t` as 0 where a step also terminated (Gymnasium may report both;
    termination wins). `discount` is the scalar gamma.
    """
    check_time_major(r_t=r_t, truncated_t=truncated_t, v_final_t=v_final_t)
    return r_t + discount * truncated_t.to(r_t.dtype) * v_final_t


def episode_discounts(terminated_t, truncated_t, discount):
    """Per-step discounts that cut the trace at every episode end.

        discount_t = discount * (1 - (terminated_t OR truncated_t))

    Both kinds of end cut: the next stored observation belongs to a new episode.
    Truncation's bootstrap is carried by `bootstrap_truncation` instead. The result
    has the dtype of `terminated_t` if it is floating, else the default dtype.
    """
    check_time_major(terminated_t=terminated_t, truncated_t=truncated_t)
    dtype = terminated_t.dtype if terminated_t.is_floating_point() else torch.get_default_dtype()
    done_t = (terminated_t != 0) | (truncated_t != 0)
    return discount * (~done_t).to(dtype)


def _backward_accumulate(x_t, coef_t):
    """acc_t = x_t + coef_t * acc_{t+1}, with acc_T = 0.

    Solved as the upper bidiagonal system (I - U) acc = x per env column, U holding
    coef_t just above the diagonal: back-substitution is this very recurrence (the
    loop's result to rounding; on the Zen 3 EPYC, to the bit), in a handful of ops
    instead of ~100 for a 32-step rollout. A vector model's learner step is mostly
    small ops like these: on Pendulum the loop took ~0.6 ms of a ~6.5-ms step, the
    solve ~0.1.
    """
    steps, batch = x_t.shape
    eye = torch.eye(steps, dtype=x_t.dtype, device=x_t.device).expand(batch, steps, steps)
    system = eye - torch.diag_embed(coef_t.T[:, :-1], offset=1)
    acc = torch.linalg.solve_triangular(system, x_t.T.unsqueeze(-1), upper=True)
    return acc.squeeze(-1).T.contiguous()


@torch.no_grad()
def vtrace(v_tm1, v_t, r_t, discount_t, log_rho_t, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, lambda_=1.0):
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018), with
    the paper's lambda (section 4.2) folded into the trace coefficients.

    With rho_t = min(rho_bar, pi/mu) and c_t = lambda_ * min(c_bar, pi/mu), pi/mu = exp(log_rho_t):

        delta_t = rho_t * (r_t + discount_t * v_t - v_tm1)
        vs_tm1 - v_tm1 = acc_t,   acc_t = delta_t + discount_t * c_t * acc_{t+1},   acc_T = 0
        q_t = lambda_ * vs_t + (1 - lambda_) * v_t
        pg_advantage_t = min(pg_rho_bar, pi/mu) * (r_t + discount_t * q_t - v_tm1)

    where vs_t is vs_tm1 shifted one step forward, bootstrapped with v_t[-1] at the
    end. Mixing the advantage's bootstrap q_t with the same lambda makes the
    on-policy case (pi = mu) exactly GAE(lambda) for the advantages and the
    lambda-returns for the targets; lambda_ = 1 is the paper's default V-trace.
    `pg_rho_bar` defaults to `rho_bar`. Returns detached `VTraceReturns`.
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
    """Generalized advantage estimates (Schulman et al. 2016), detached [T, B].

        delta_t = r_t + discount_t * v_t - v_tm1
        A_t = delta_t + discount_t * lambda_ * A_{t+1},   A_T = 0

    The matching value targets (lambda-returns) are A_t + v_tm1.
    """
    check_time_major(v_tm1=v_tm1, v_t=v_t, r_t=r_t, discount_t=discount_t)
    delta_t = r_t + discount_t * v_t - v_tm1
    return _backward_accumulate(delta_t, discount_t * lambda_)
