"""FusedAdam (fastrl/learning/adam.py) against Adam's textbook update written here in
float64, against torch.optim.Adam (its fused kernel bit for bit, its default loop
to rounding), and checkpoints that move between the two."""
import subprocess
import sys

import pytest
import torch

from fastrl.learning.adam import FusedAdam

LR, EPS, BETA1, BETA2 = 3e-3, 1e-6, 0.9, 0.999
SHAPES = [(5, 3), (3,), (2, 4, 3, 3), (1,)]


def _params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]


def _grads(step, seed=1):
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    # Gradients of very different sizes per tensor, as a model's layers have.
    return [torch.randn(s, generator=gen) * 10.0 ** (i - 2) for i, s in enumerate(SHAPES)]


def _run(optimizer, params, steps, first=0):
    for t in range(first, first + steps):
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(params, _grads(t)):
            p.grad = g.clone()
        optimizer.step()


def _textbook(steps):
    """Kingma and Ba's Adam, Algorithm 1, in float64."""
    theta = [p.detach().double() for p in _params()]
    m = [torch.zeros_like(x) for x in theta]
    v = [torch.zeros_like(x) for x in theta]
    for t in range(1, steps + 1):
        for i, g_t in enumerate(_grads(t - 1)):
            g_t = g_t.double()
            m[i] = BETA1 * m[i] + (1 - BETA1) * g_t
            v[i] = BETA2 * v[i] + (1 - BETA2) * g_t * g_t
            m_hat, v_hat = m[i] / (1 - BETA1 ** t), v[i] / (1 - BETA2 ** t)
            theta[i] = theta[i] - LR * m_hat / (v_hat.sqrt() + EPS)
    return theta


def test_steps_follow_the_textbook_update():
    params = _params()
    _run(FusedAdam(params, lr=LR, eps=EPS), params, 25)
    for p, ref in zip(params, _textbook(25)):
        torch.testing.assert_close(p.detach().double(), ref, rtol=1e-5, atol=1e-6)


def test_steps_equal_torch_adams_fused_kernel_bit_for_bit_and_its_default_loop_to_rounding():
    ours, fused, loop = _params(), _params(), _params()
    _run(FusedAdam(ours, lr=LR, eps=EPS), ours, 25)
    _run(torch.optim.Adam(fused, lr=LR, eps=EPS, fused=True), fused, 25)
    _run(torch.optim.Adam(loop, lr=LR, eps=EPS, foreach=False), loop, 25)
    for a, b, c in zip(ours, fused, loop):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


def test_a_parameter_without_a_gradient_is_left_alone_and_gets_no_moments():
    params = _params()
    optimizer = FusedAdam(params, lr=LR, eps=EPS)
    before = params[1].detach().clone()
    optimizer.zero_grad()
    for i, (p, g) in enumerate(zip(params, _grads(0))):
        p.grad = None if i == 1 else g
    optimizer.step()
    assert torch.equal(params[1], before) and params[1] not in optimizer.state
    assert int(optimizer.state[params[0]]["step"]) == 1


def test_the_rate_set_on_param_groups_is_the_rate_used():
    a, b = _params(), _params()
    slow, fast = FusedAdam(a, lr=LR, eps=EPS), FusedAdam(b, lr=LR, eps=EPS)
    fast.param_groups[0]["lr"] = 2 * LR  # as the learner's schedule and PBT set it
    _run(slow, a, 1), _run(fast, b, 1)
    start = _params()
    # Adam's first step moves each weight by about lr, whatever the gradient's size.
    torch.testing.assert_close((b[0] - start[0]).detach(), 2 * (a[0] - start[0]).detach(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("direction", ["torch to fastrl", "fastrl to torch"])
def test_a_state_saved_by_one_resumes_in_the_other(direction):
    """A checkpoint of a run before this optimizer (torch.optim.Adam's default loop)
    resumes with FusedAdam, and the reverse, and both go on as an unbroken run."""
    make_first, make_second = ((lambda p: torch.optim.Adam(p, lr=LR, eps=EPS, foreach=False)),
                               (lambda p: FusedAdam(p, lr=LR, eps=EPS)))
    if direction == "fastrl to torch":
        make_first, make_second = make_second, make_first
    first = _params()
    optimizer = make_first(first)
    _run(optimizer, first, 10)
    saved = optimizer.state_dict()
    saved = {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in saved["state"].items()},
             "param_groups": saved["param_groups"]}

    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    second = make_second(resumed)
    second.load_state_dict(saved)
    _run(second, resumed, 10, first=10)
    unbroken = _params()
    _run(torch.optim.Adam(unbroken, lr=LR, eps=EPS, foreach=False), unbroken, 20)
    for a, b in zip(resumed, unbroken):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_state_saved_for_another_model_is_refused_with_what_to_do():
    optimizer = FusedAdam(_params(), lr=LR)
    other = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))], lr=LR)
    with pytest.raises(ValueError, match="saved for another model"):
        optimizer.load_state_dict(other.state_dict())


def test_making_and_stepping_it_leaves_torch_dynamo_unimported():
    """Half the point of the class: torch.optim imports torch._dynamo at its first call."""
    code = ("import sys, torch\n"
            "from fastrl.learning.adam import FusedAdam\n"
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
            "o = FusedAdam([p], lr=0.1); o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\n"
            "assert 'torch._dynamo' not in sys.modules, 'FusedAdam imported torch._dynamo'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
