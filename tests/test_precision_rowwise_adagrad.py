"""Row-wise Adagrad: sparse row updates against a dense formula, one accumulator per row."""

import torch
import torch.nn.functional as F

from dlrmkit.optim.rowwise_adagrad import RowWiseAdagrad


def test_rowwise_adagrad_matches_dense_formula():
    gen = torch.Generator().manual_seed(0)
    rows, dim, lr, eps = 30, 4, 0.3, 1e-10
    w0 = torch.randn(rows, dim, generator=gen)
    p = torch.nn.Parameter(w0.clone())
    opt = RowWiseAdagrad([p], lr=lr, eps=eps)
    w = w0.double().clone()
    acc = torch.zeros(rows, dtype=torch.float64)
    for ids in ([1, 1, 1, 5, 7], [0, 5, 5, 19, 2, 2], [7], [3, 4, 3, 4, 19, 0]):
        ids_t = torch.tensor(ids)
        up = torch.randn(len(ids), dim, generator=gen)
        p.grad = None
        (F.embedding(ids_t, p, sparse=True) * up).sum().backward()
        opt.step()
        g = torch.zeros(rows, dim, dtype=torch.float64).index_add_(0, ids_t, up.double())
        touched = torch.zeros(rows, dtype=torch.bool)
        touched[ids_t] = True
        acc[touched] += (g[touched] ** 2).mean(1)
        w[touched] -= lr * g[touched] / (acc[touched].sqrt() + eps).unsqueeze(1)
    assert opt.state[p]["sum"].shape == (rows,)
    torch.testing.assert_close(p.detach().double(), w, rtol=1e-5, atol=1e-6)
    untouched = [r for r in range(rows) if r not in {0, 1, 2, 3, 4, 5, 7, 19}]
    assert torch.equal(p.detach()[untouched], w0[untouched])
