"""A GRU unrolled over a trajectory batch, with resets, and its backward by hand.

The learner re-runs the policy's GRU over T+1 steps of B trajectories for the
loss. Unrolled step by step under autograd, every step's hidden projection
h_tm1 W_hh^T records its own weight gradient, so the backward adds T+1 products
of K = B rows into W_hh's [3H, H] gradient one after another: doom_battle's 33
steps x 32 rows took 23 ms a learner step for that sum where one product over
all 1,056 rows takes 11 (Intel Xeon, one thread). Here the forward keeps what
the backward needs, and the backward runs the recurrence for the gradients of
the states and the gates alone, then takes W_hh's and b_hh's gradients in one
product and one sum over every step. The forward multiplies by a contiguous
copy of W_hh^T, made once: MKL repacks a transposed operand on every call, and
33 small products cost 18.7 ms that way against 14.0 (same CPU).

The arithmetic is `gru_step`'s (PyTorch's gate order, the same operations in the
same order), so outputs match the step-by-step unroll to rounding of the GEMMs;
tests/test_gru_sequence.py checks values and every gradient against autograd's
own differentiation of that unroll.
"""
from __future__ import annotations

import hashlib
import pathlib
from typing import Optional, Tuple

import torch


def gru_sequence(gi: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor, w_hh: torch.Tensor,
                 b_hh: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Unroll a GRU over T steps of B rows.

    gi [T, B, 3H]: the input projections x_t W_ih^T + b_ih of every step.
    h0 [B, H]: the state before step 0.
    keep [T, B, 1]: 0 where the state is zeroed before step t (an episode starts),
        else 1; not differentiated.
    w_hh [3H, H], b_hh [3H]: the hidden projection.
    Returns (outputs [T, B, H], the state after each step; states [T, B, H], the
    state carried into each step before its reset).
    """
    steps, batch, three_h = gi.shape
    hidden = h0.shape[-1]
    if three_h != 3 * hidden or tuple(w_hh.shape) != (three_h, hidden) or tuple(b_hh.shape) != (three_h,):
        raise ValueError(f"gru_sequence needs gi [T, B, 3H], h0 [B, H], w_hh [3H, H] and b_hh [3H]; got "
                         f"{tuple(gi.shape)}, {tuple(h0.shape)}, {tuple(w_hh.shape)} and {tuple(b_hh.shape)}.")
    if tuple(h0.shape) != (batch, hidden) or tuple(keep.shape) != (steps, batch, 1):
        raise ValueError(f"gru_sequence needs h0 [{batch}, {hidden}] and keep [{steps}, {batch}, 1] for gi "
                         f"{tuple(gi.shape)}; got {tuple(h0.shape)} and {tuple(keep.shape)}.")
    if torch.compiler.is_compiling():
        return tuple(_op(gi, h0, keep, w_hh, b_hh)[:2])
    return _EagerGruSequence.apply(gi, h0, keep, w_hh, b_hh)


# Under torch.compile the unroll is a custom op, which the compile calls whole: as
# an autograd.Function inductor traced its loops into the graph and lowered the
# contiguous W_hh^T copy away (the unroll and its backward 74 ms a doom_battle
# batch, as an op 56). Eagerly it is an autograd.Function over the same two
# functions: a custom op's first call imports torch._dynamo (1.4-1.7 s), which
# the learner's first step would wait for. The ops' names carry a digest of this
# file: inductor's on-disk cache knows a graph by the ops it calls, not by what
# they return, and served a graph compiled against an earlier version's outputs
# after they changed.
_SOURCE_DIGEST = hashlib.sha1(pathlib.Path(__file__).read_bytes()).hexdigest()[:10]


def _unroll(gi: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor, w_hh: torch.Tensor,
            b_hh: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(outputs, states, then what the backward needs: each step's reset state h_tm1,
    its gates [r_t, z_t, h_n] (h_n the hidden half of n_t's pre-activation) and its
    candidate n_t). Every step writes into the slices of these, not into tensors of
    its own to stack at the end: a GRU step's ops are small, and the copies and
    allocations were a fifth of the unroll's time."""
    steps, batch, three_h = gi.shape
    hidden = three_h // 3
    w_t = w_hh.t().contiguous()
    outputs, states, masked, news = (gi.new_empty(steps, batch, hidden) for _ in range(4))
    gates = gi.new_empty(steps, batch, three_h)
    h = h0
    for t in range(steps):
        states[t] = h
        h_tm1 = torch.mul(h, keep[t], out=masked[t])
        g_t = torch.addmm(b_hh, h_tm1, w_t, out=gates[t])
        g_t[:, :2 * hidden].add_(gi[t, :, :2 * hidden]).sigmoid_()  # r_t and z_t
        r_t, z_t, h_n = g_t.split(hidden, -1)
        n_t = torch.mul(h_n, r_t, out=news[t]).add_(gi[t, :, 2 * hidden:]).tanh_()
        h = torch.sub(h_tm1, n_t, out=outputs[t]).mul_(z_t).add_(n_t)
    return outputs, states, masked, gates, news


def _unroll_shapes(gi, h0, keep, w_hh, b_hh):
    steps, batch, three_h = gi.shape
    return (*(gi.new_empty(steps, batch, three_h // 3) for _ in range(3)), gi.new_empty(steps, batch, three_h),
            gi.new_empty(steps, batch, three_h // 3))


def _unroll_backward(d_outputs: Optional[torch.Tensor], d_states: Optional[torch.Tensor], keep: torch.Tensor,
                     w_hh: torch.Tensor, masked: torch.Tensor, gates: torch.Tensor,
                     news: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d gi, d h0, d w_hh, d b_hh) from the gradients of outputs and of states (None
    where the caller's loss did not use them)."""
    steps, batch, three_h = gates.shape
    hidden = three_h // 3
    # d_gh: the gradient of each step's hidden projection [r, z, h_n]; the input
    # projection's is the same but for its last third, d of n_t's pre-activation,
    # kept apart and joined once at the end (a copy a step was 3 ms of the backward).
    d_gh = torch.empty_like(gates)
    d_pre_n_all = torch.empty_like(news)
    d_h = masked.new_zeros(batch, hidden)  # what reaches h_t from the steps after t
    for t in reversed(range(steps)):
        if d_outputs is not None:
            d_h.add_(d_outputs[t])
        r_t, z_t, h_n = gates[t].split(hidden, -1)
        n_t, h_tm1 = news[t], masked[t]
        d_r, d_z, d_h_n = d_gh[t].split(hidden, -1)
        # h_t = (h_tm1 - n_t) * z_t + n_t, n_t = tanh(i_n + h_n * r_t): d of n_t's
        # pre-activation, of z_t and of r_t, then both gates through their sigmoids
        d_pre_n = torch.mul(n_t, n_t, out=d_pre_n_all[t]).neg_().add_(1.0).mul_(d_h).mul_(torch.rsub(z_t, 1.0))
        torch.sub(h_tm1, n_t, out=d_z).mul_(d_h)
        torch.mul(d_pre_n, h_n, out=d_r)
        rz = gates[t, :, :2 * hidden]
        d_gh[t, :, :2 * hidden].mul_(torch.rsub(rz, 1.0).mul_(rz))
        torch.mul(d_pre_n, r_t, out=d_h_n)
        d_h = torch.addmm(d_h.mul_(z_t), d_gh[t], w_hh).mul_(keep[t])
        if d_states is not None:
            d_h.add_(d_states[t])
    d_gi = torch.cat([d_gh[..., :2 * hidden], d_pre_n_all], -1)
    flat_gh = d_gh.flatten(0, 1)
    return d_gi, d_h, flat_gh.t().mm(masked.flatten(0, 1)), flat_gh.sum(0)


def _unroll_backward_shapes(d_outputs, d_states, keep, w_hh, masked, gates, news):
    steps, batch, three_h = gates.shape
    return (gates.new_empty(steps, batch, three_h), gates.new_empty(batch, three_h // 3),
            w_hh.new_empty(w_hh.shape), w_hh.new_empty(three_h))


class _EagerGruSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gi, h0, keep, w_hh, b_hh):
        outputs, states, *saved = _unroll(gi, h0, keep, w_hh, b_hh)
        ctx.save_for_backward(keep, w_hh, *saved)
        # The gradients of outputs a loss did not use come as None, not as zeros made
        # for them (the states often).
        ctx.set_materialize_grads(False)
        return outputs, states

    @staticmethod
    def backward(ctx, d_outputs, d_states):
        keep, w_hh, *saved = ctx.saved_tensors
        d_gi, d_h0, d_w_hh, d_b_hh = _unroll_backward(d_outputs, d_states, keep, w_hh, *saved)
        return d_gi, d_h0, None, d_w_hh, d_b_hh


# The fakes (*_shapes) give a compile the outputs' shapes without running the loop.
_op = torch.library.custom_op(f"fastrl::gru_sequence_{_SOURCE_DIGEST}", _unroll, mutates_args=())
_op.register_fake(_unroll_shapes)
_op_backward = torch.library.custom_op(f"fastrl::gru_sequence_backward_{_SOURCE_DIGEST}", _unroll_backward,
                                       mutates_args=())
_op_backward.register_fake(_unroll_backward_shapes)


def _save(ctx, inputs, output):
    _, _, keep, w_hh, _ = inputs
    ctx.save_for_backward(keep, w_hh, *output[2:])
    ctx.set_materialize_grads(False)  # as _EagerGruSequence: the saved outputs' gradients never made


def _differentiate(ctx, d_outputs, d_states, *_):
    keep, w_hh, *saved = ctx.saved_tensors
    d_gi, d_h0, d_w_hh, d_b_hh = _op_backward(d_outputs, d_states, keep, w_hh, *saved)
    return d_gi, d_h0, None, d_w_hh, d_b_hh


_op.register_autograd(_differentiate, setup_context=_save)
