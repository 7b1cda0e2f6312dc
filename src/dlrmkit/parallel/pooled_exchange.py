"""The pooled embeddings' all-to-all as an autograd step: forward's result (received by a request
the sharded embedding started before the model) stands for a function of this rank's pooled
lookups; backward sends the gradient back along the reverse route on the same Transport."""

from __future__ import annotations

import torch

from dlrmkit.parallel.transport import AllToAll, Transport


class PooledAllToAll(torch.autograd.Function):
    """`received` (what the forward all-to-all of `pooled` brought) as a differentiable function
    of `pooled`. The node is made when forward reads the result, after the bottom MLP, so
    autograd (ready nodes, newest first) starts the backward all-to-all as soon as its gradient
    is known, before the bottom MLP's backward. With `deferred` (the tables keep their
    gradients unread until the optimizers step: FusedTable.defer_grads) backward returns the
    buffer the exchange fills and waits for it when the backward pass ends, so the bottom MLP's
    backward runs while it travels."""

    @staticmethod
    def forward(
        ctx,
        pooled: torch.Tensor,
        received: torch.Tensor,
        transport: Transport,
        send_counts: list[int],
        recv_counts: list[int],
        deferred: bool,
    ):
        ctx.transport, ctx.counts, ctx.shape, ctx.deferred = (
            transport,
            (send_counts, recv_counts),
            pooled.shape,
            deferred,
        )
        return received.view_as(received)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        send_counts, recv_counts = ctx.counts
        back = torch.empty(sum(send_counts), dtype=grad.dtype, device=grad.device)
        op = AllToAll(grad.contiguous(), recv_counts, send_counts, "pooled_bwd", out=back)
        request = ctx.transport.start([op])
        if ctx.deferred:
            torch.autograd.Variable._execution_engine.queue_callback(request.wait)
        else:
            request.wait()
        return back.view(ctx.shape), None, None, None, None, None
