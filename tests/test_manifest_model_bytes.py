"""checkpoint.manifest.model_bytes counts what a built DLRM holds: every parameter and buffer,
the DCNv2 cross layers and the FM and wide terms included, computed without allocating the model."""

import pytest
import torch

from dlrmkit.checkpoint.manifest import model_bytes
from dlrmkit.model.dlrm import DLRM, ModelConfig

CONFIGS = {
    "dot": ModelConfig(13, [100, 200, 7], 16, [32, 16], [64, 1]),
    "dcn-low-rank": ModelConfig(13, [100, 200, 7], 16, [32, 16], [64, 1], "dcn", dcn_layers=3, dcn_rank=8),
    "dcn-full": ModelConfig(13, [100, 200, 7], 16, [32, 16], [64, 1], "dcn", dcn_layers=2, dcn_rank=None),
    "fm-wide": ModelConfig(13, [100, 200, 7], 16, [32, 16], [64, 1], fm=True, wide=True),
}


def held_bytes(model: torch.nn.Module, tables: bool = True) -> int:
    """Bytes of a built model: its state dict, plus the buffers a state dict leaves out (index
    buffers registered non-persistent); `tables` False: without the embedding tables' entries."""
    state = [v for k, v in model.state_dict().items() if tables or not k.startswith("embeddings.")]
    unsaved = [m._buffers[n] for m in model.modules() for n in m._non_persistent_buffers_set]
    return sum(t.numel() * t.element_size() for t in state + unsaved)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_model_bytes_equal_a_built_models_state(name):
    cfg = CONFIGS[name]
    model = DLRM(cfg)
    assert model_bytes(cfg) == held_bytes(model)
    assert model_bytes(cfg, tables=False) == held_bytes(model, tables=False)
    tables = sum(cfg.table_sizes) * model.embeddings.tables[0].dim * 4
    assert model_bytes(cfg) - model_bytes(cfg, tables=False) == tables


def test_the_cross_layers_are_counted():
    cfg = CONFIGS["dcn-low-rank"]
    cross = sum(p.numel() * 4 for p in DLRM(cfg).interaction.parameters())
    n = 4 * 16  # (3 tables + the bottom MLP's output) x dim
    assert cross == 3 * (8 * n + n * 8 + n) * 4  # V, U and the bias of 3 layers
    cat = ModelConfig(13, [100, 200, 7], 16, [32, 16], [64, 1], "cat")  # the same top MLP, no cross network
    assert model_bytes(cfg) - model_bytes(cat) == cross
