"""A GRU unrolled over a trajectory batch, with resets, and its backward by hand.

Under autograd each step's h_tm1 W_hh^T adds its own small weight-gradient product;
here the backward runs the recurrence for the state and gate gradients alone, then
takes W_hh's and b_hh's gradients in one product over all steps (gru_unroll in
benchmarks/experiments/README.md). The arithmetic is `gru_step`'s, so outputs match
the step-by-step unroll up to GEMM rounding; tests/test_gru_sequence.py checks every
gradient against autograd.
"""
from __future__ import annotations

import hashlib
import pathlib
from typing import Optional, Tuple

import torch


def gru_sequence(gi: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor, w_hh: torch.Tensor,
                 b_hh: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Unroll a GRU over gi [T, B, 3H] (input projections x_t W_ih^T + b_ih) from h0
    [B, H], zeroing the state where keep [T, B, 1] is 0 (an episode starts). Returns
    (outputs [T, B, H], the state after each step; states [T, B, H], the state
    carried into each step before its reset)."""
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


# Under torch.compile the unroll is a custom op, called whole: traced as an
# autograd.Function, inductor lowered the loops and the W_hh^T copy into something
# slower. Eagerly it stays an autograd.Function, as a custom op's first call imports
# torch._dynamo, which the learner's first step would wait for. The op names carry a
# digest of this file, as inductor's on-disk cache knows ops by name only.
_SOURCE_DIGEST = hashlib.sha1(pathlib.Path(__file__).read_bytes()).hexdigest()[:10]


def _unroll(gi: torch.Tensor, h0: torch.Tensor, keep: torch.Tensor, w_hh: torch.Tensor,
            b_hh: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(outputs, states, then for the backward: each step's reset state h_tm1, gates
    [r_t, z_t, h_n] and candidate n_t). Steps write into slices of preallocated
    tensors: with ops this small, per-step allocations and a final stack cost a lot.
    W_hh^T is made contiguous once, as MKL would repack a transposed operand each call."""
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
    """(d gi, d h0, d w_hh, d b_hh) from the gradients of outputs and states (None
    where the loss did not use them)."""
    steps, batch, three_h = gates.shape
    hidden = three_h // 3
    # d_gh: the gradient of each step's hidden projection [r, z, h_n]; the input
    # projection's differs only in its last third, kept apart and joined once at the end.
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
        # Unused output gradients arrive as None rather than materialised zeros.
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
