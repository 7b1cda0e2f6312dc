"""`dlrmkit bench` under torchrun: the benchmark model sharded by a plan, random one-hot ids
(one id per table and sample: the sharded module's input), each rank stepping its slice of the
global batch. Reported throughput is global samples/s."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrmkit.model.dlrm import DLRM, ModelConfig
from dlrmkit.parallel.dist import batch_slice, batch_split, init_distributed, launched_by_torchrun
from dlrmkit.parallel.hybrid import HybridParallel, ParallelConfig, build_plan
from dlrmkit.parallel.sharded_embedding import DistIds


@dataclass
class LocalBatch:
    dense: torch.Tensor
    ids: DistIds
    labels: torch.Tensor


class BenchParallel(HybridParallel):
    def batches(self, cfg: ModelConfig, global_batch: int, count: int, seed: int) -> list[LocalBatch]:
        gen = torch.Generator().manual_seed(seed)
        n, r = self.ctx.world_size, self.ctx.rank
        sizes, (a, b) = batch_split(global_batch, n), batch_slice(global_batch, r, n)
        out = []
        for _ in range(count):
            ids = (torch.rand(global_batch, len(cfg.table_sizes), generator=gen)
                   * torch.tensor(cfg.table_sizes, dtype=torch.float64).float()).long()
            dense = torch.rand(global_batch, cfg.num_numerical, generator=gen)
            labels = torch.randint(0, 2, (global_batch,), generator=gen).float()
            out.append(LocalBatch(dense[a:b], DistIds(ids[a:b], sizes), labels[a:b]))
        return out

    def step(self, batch: LocalBatch, optimizers) -> None:
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        self.loss_backward(self.model(batch.dense, batch.ids), batch.labels, sum(batch.ids.batch_sizes))
        for opt in optimizers:
            opt.step()


def parallel_setup(model: DLRM, batch_size: int, sharding: str, backend: str | None = None) -> BenchParallel | None:
    """None unless started by torchrun."""
    if not launched_by_torchrun():
        return None
    ctx = init_distributed(backend)
    pcfg = ParallelConfig(sharding=sharding)
    return BenchParallel(model, build_plan(model, ctx, pcfg, batch_size), ctx, pcfg)
