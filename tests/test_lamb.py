"""LAMB: the update against the paper's formulas written out in float64, the trust ratio, fp32
state for bf16 parameters, and convergence on a least-squares problem."""

import pytest
import torch

from dlrmkit.optim.lamb import Lamb


def reference_lamb(w, grads, lr, b1=0.9, b2=0.999, eps=1e-6, wd=0.0):
    w = w.double().clone()
    m = torch.zeros_like(w)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps) + wd * w
        trust = w.norm() / r.norm()
        w = w - lr * trust * r
    return w


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_formula(wd):
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(7, 5, generator=gen)
    grads = [torch.randn(7, 5, generator=gen) for _ in range(10)]
    p = torch.nn.Parameter(w0.clone())
    opt = Lamb([p], lr=0.01, weight_decay=wd)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    expect = reference_lamb(w0, grads, 0.01, wd=wd)
    torch.testing.assert_close(p.detach().double(), expect, rtol=1e-5, atol=1e-6)


def test_trust_ratio_scales_step_to_weight_norm():
    # first step of Adam is ~lr*sign(g) per element; LAMB rescales it to lr*||w|| in norm
    for scale in (0.01, 100.0):
        p = torch.nn.Parameter(torch.full((100,), scale))
        opt = Lamb([p], lr=0.1)
        p.grad = torch.randn(100)
        before = p.detach().clone()
        opt.step()
        step_norm = float((p.detach() - before).norm())
        assert step_norm == pytest.approx(0.1 * float(before.norm()), rel=1e-4)


def test_state_is_fp32_for_bf16_params():
    p = torch.nn.Parameter(torch.randn(4, 4).to(torch.bfloat16))
    opt = Lamb([p], lr=0.01)
    p.grad = torch.randn(4, 4).to(torch.bfloat16)
    opt.step()
    assert p.dtype == torch.bfloat16
    assert opt.state[p]["exp_avg"].dtype == torch.float32 and opt.state[p]["exp_avg_sq"].dtype == torch.float32


def test_lamb_rejects_sparse_gradients():
    p = torch.nn.Parameter(torch.randn(10, 3))
    torch.nn.functional.embedding(torch.tensor([1, 2]), p, sparse=True).sum().backward()
    with pytest.raises(ValueError, match="dense"):
        Lamb([p], lr=0.1).step()


def test_lamb_fits_least_squares():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 20, generator=gen)
    w_true = torch.randn(20, 1, generator=gen)
    y = x @ w_true
    lin = torch.nn.Linear(20, 1)
    opt = Lamb(lin.parameters(), lr=0.05)
    first = None
    for _ in range(300):
        loss = torch.nn.functional.mse_loss(lin(x), y)
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 1e-2 * first
