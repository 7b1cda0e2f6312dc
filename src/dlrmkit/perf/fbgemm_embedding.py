"""Optional FBGEMM table-batched embedding (`dlrmkit bench --embedding-backend fbgemm`, needs the
`fbgemm-gpu-cpu` wheel: `pip install -c constraints.txt 'dlrmkit[fbgemm]'`). One TBE op looks up
all tables and applies exact SGD to the touched rows inside backward (the optimizer is fused, so
the model's sparse optimizer sees no gradient for these weights)."""

from __future__ import annotations

import torch
from torch import nn

from dlrmkit.errors import DlrmkitError
from dlrmkit.model.embedding import EmbeddingCollection, JaggedIds


def fbgemm_available() -> tuple[bool, str]:
    """(usable, reason when not)."""
    try:
        import fbgemm_gpu  # noqa: F401
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen  # noqa: F401
    except Exception as exc:  # ImportError, or an ABI mismatch with this torch
        return False, f"fbgemm_gpu not importable ({type(exc).__name__}: {str(exc)[:120]})"
    return True, ""


class FbgemmEmbeddings(nn.Module):
    """Drop-in for EmbeddingCollection with one width: forward(ids) -> [B, T, dim]."""

    def __init__(self, source: EmbeddingCollection, lr: float):
        super().__init__()
        ok, why = fbgemm_available()
        if not ok:
            raise DlrmkitError(f"--embedding-backend fbgemm: {why}")
        if not source.uniform:
            raise DlrmkitError("--embedding-backend fbgemm: needs tables of one width")
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        self.dim, self.num_tables = source.dims[0], len(source.table_sizes)
        specs = [(rows, self.dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows in source.table_sizes]
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=EmbOptimType.EXACT_SGD, learning_rate=lr, pooling_mode=PoolingMode.SUM
        )
        fused = source.tables[0]
        with torch.no_grad():
            for t, w in enumerate(self.tbe.split_embedding_weights()):
                start = int(fused.row_offsets[t])
                w.copy_(fused.weight[start : start + w.shape[0]])

    def forward(self, ids) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            ids = JaggedIds.from_dense(ids)
        out = self.tbe(ids.values, ids.offsets)
        return out.view(ids.batch_size, self.num_tables, self.dim)


def use_fbgemm(model: nn.Module, lr: float) -> None:
    """Swap `model.embeddings` for FBGEMM's TBE with the same weights (before building optimizers)."""
    model.embeddings = FbgemmEmbeddings(model.embeddings, lr)
