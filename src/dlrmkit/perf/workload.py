"""The benchmark workloads: model shapes and random batches made up front (ids uniform over each
table, bags of 1..max_bag ids), shared by `dlrmkit bench`, its sharded run and the scripts in
benchmarks/."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlrmkit.model.dlrm import ModelConfig
from dlrmkit.model.embedding import JaggedIds

BENCH_MODELS: dict[str, ModelConfig] = {
    "small": ModelConfig(13, [1_000_000] * 8, 16, [512, 256, 64, 16], [512, 256, 1]),
    "mlperf-shape": ModelConfig(13, [200_000] * 26, 128, [512, 256, 128], [1024, 1024, 512, 256, 1]),
}


@dataclass
class RandomBatch:
    dense: torch.Tensor
    ids: JaggedIds
    labels: torch.Tensor


def random_batches(cfg: ModelConfig, batch_size: int, count: int, seed: int, max_bag: int = 10) -> list[RandomBatch]:
    """`count` batches made up front, so the timed loop measures training only."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    sizes = torch.tensor(cfg.table_sizes, dtype=torch.int64)
    for _ in range(count):
        t = len(cfg.table_sizes)
        lengths = torch.randint(1, max_bag + 1, (t, batch_size), generator=gen)
        per_table = lengths.sum(1)
        values = (torch.rand(int(per_table.sum()), generator=gen) * torch.repeat_interleave(sizes, per_table)).long()
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.flatten().cumsum(0)])
        out.append(
            RandomBatch(
                torch.rand(batch_size, cfg.num_numerical, generator=gen),
                JaggedIds(values, offsets, batch_size),
                torch.randint(0, 2, (batch_size,), generator=gen).float(),
            )
        )
    return out
