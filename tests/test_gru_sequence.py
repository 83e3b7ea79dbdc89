"""gru_sequence against the step-by-step unroll it replaces and against finite
differences: values, every gradient, resets, the op inside a compiled graph, and
an eager call that imports no torch._dynamo."""
import subprocess
import sys

import pytest
import torch

from fastrl.algo.gru_sequence import gru_sequence
from fastrl.algo.model import gru_step


def unrolled(gi, h0, keep, w_hh, b_hh):
    """The unroll as the model ran it before gru_sequence: gru_step per step, autograd
    recording each step's hidden projection and so each step's weight gradient. The
    reference gru_sequence must equal, value for value and gradient for gradient."""
    h, outputs, states = h0, [], []
    for t in range(gi.shape[0]):
        states.append(h)
        h = gru_step(gi[t], h * keep[t], w_hh, b_hh)
        outputs.append(h)
    return torch.stack(outputs), torch.stack(states)


T, B, H = 6, 3, 4


def inputs(dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gi = torch.randn(T, B, 3 * H, generator=gen, dtype=dtype)
    h0 = torch.randn(B, H, generator=gen, dtype=dtype)
    keep = torch.ones(T, B, 1, dtype=dtype)
    keep[2, 0] = keep[4, 2] = keep[0, 1] = 0.0  # episodes starting mid-trajectory, and at step 0
    w_hh = torch.randn(3 * H, H, generator=gen, dtype=dtype) * 0.5
    b_hh = torch.randn(3 * H, generator=gen, dtype=dtype)
    return [gi.requires_grad_(), h0.requires_grad_(), keep, w_hh.requires_grad_(), b_hh.requires_grad_()]


def gradients(fn, args, d_outputs, d_states):
    outputs, states = fn(*args)
    loss = (outputs * d_outputs).sum() + (0.0 if d_states is None else (states * d_states).sum())
    trained = [a for a in args if a.requires_grad]
    return (outputs.detach(), states.detach()), torch.autograd.grad(loss, trained)


@pytest.mark.parametrize("states_used", [True, False])
def test_values_and_gradients_are_the_unrolls(states_used):
    args = inputs()
    gen = torch.Generator().manual_seed(1)
    d_outputs = torch.randn(T, B, H, generator=gen, dtype=torch.float64)
    d_states = torch.randn(T, B, H, generator=gen, dtype=torch.float64) if states_used else None
    (out, states), grads = gradients(gru_sequence, args, d_outputs, d_states)
    (want_out, want_states), want_grads = gradients(unrolled, args, d_outputs, d_states)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(states, want_states, rtol=1e-12, atol=1e-12)
    for name, got, want in zip(("gi", "h0", "w_hh", "b_hh"), grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"d {n}: {m}")


def test_gradients_match_finite_differences():
    gi, h0, keep, w_hh, b_hh = inputs()
    assert torch.autograd.gradcheck(lambda *a: gru_sequence(a[0], a[1], keep, a[2], a[3]), (gi, h0, w_hh, b_hh))


def test_a_reset_starts_from_zero_and_zero_weights_halve_the_state():
    # Zero weights make both gates sigmoid(0) = 0.5 and the candidate tanh(0) = 0, so
    # each step halves the state; a reset zeroes it first, and no gradient crosses it.
    h0 = torch.tensor([[8.0, -4.0]], requires_grad=True)
    keep = torch.tensor([1.0, 1.0, 0.0, 1.0]).view(4, 1, 1)
    outputs, states = gru_sequence(torch.zeros(4, 1, 6), h0, keep, torch.zeros(6, 2), torch.zeros(6))
    want = torch.tensor([[4.0, -2.0], [2.0, -1.0], [0.0, 0.0], [0.0, 0.0]]).view(4, 1, 2)
    torch.testing.assert_close(outputs, want)
    torch.testing.assert_close(states[1:], want[:-1])
    outputs[:2].sum().backward(retain_graph=True)
    torch.testing.assert_close(h0.grad, torch.tensor([[0.75, 0.75]]))  # 0.5 + 0.25
    h0.grad = None
    outputs[2:].sum().backward()
    torch.testing.assert_close(h0.grad, torch.zeros(1, 2))


def test_shapes_are_checked():
    gi, h0, keep, w_hh, b_hh = inputs()
    with pytest.raises(ValueError, match=r"gi \[T, B, 3H\]"):
        gru_sequence(gi[..., :-1], h0, keep, w_hh, b_hh)
    with pytest.raises(ValueError, match=r"keep \[6, 3, 1\]"):
        gru_sequence(gi, h0, keep[:, :, 0], w_hh, b_hh)


def test_inside_a_compiled_graph_it_gives_the_eager_values_and_gradients():
    args = inputs(torch.float32)
    d_outputs = torch.randn(T, B, H)

    def loss(gi, h0, keep, w_hh, b_hh):
        outputs, states = gru_sequence(gi.tanh(), h0, keep, w_hh, b_hh)
        return (outputs * d_outputs).sum() + states.square().sum()

    trained = [a for a in args if a.requires_grad]
    want = torch.autograd.grad(loss(*args), trained)
    got = torch.autograd.grad(torch.compile(loss)(*args), trained)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_an_eager_unroll_leaves_torch_dynamo_unimported():
    # A custom op's first call imports torch._dynamo (1.4-1.7 s), which the learner's
    # first step would wait for; eagerly the unroll is an autograd.Function.
    code = ("import sys, torch\n"
            "from fastrl.algo.gru_sequence import gru_sequence\n"
            "gi = torch.randn(4, 2, 9, requires_grad=True); w = torch.randn(9, 3, requires_grad=True)\n"
            "outputs, states = gru_sequence(gi, torch.zeros(2, 3), torch.ones(4, 2, 1), w, torch.zeros(9))\n"
            "(outputs.sum() + states.sum()).backward()\n"
            "assert gi.grad is not None and w.grad is not None\n"
            "assert 'torch._dynamo' not in sys.modules, 'gru_sequence imported torch._dynamo'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
