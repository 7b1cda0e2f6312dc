"""`dlrmkit plan --simulate`: step time, samples/s and communication share of a plan on many
ranks, from the plan's per-rank bytes and lookups, the model's FLOPs and a hardware profile.

A roofline-style model, no fitting to the published figures it is compared with: per rank,
  compute  = MLP + interaction FLOPs of the local batch / (peak FLOPs x GEMM efficiency)
           + activation bytes (each layer's output written and read ~6 times over forward and
             backward) / HBM bandwidth,
  lookups  = pooled rows read in forward, gradient rows read and table rows read+written by
             the sparse update / HBM bandwidth,
  comm     = the plan's all-to-all bytes sent per rank + ring all-reduce of the MLP gradients,
             over NVLink inside a node and the network between nodes, plus a latency per
             collective.
No overlap of communication with compute is assumed (NVIDIA's DLRM overlaps little), so the
step time is the sum, and the slowest rank sets the pace."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from dlrmkit.errors import DlrmkitError


@dataclass
class HardwareProfile:
    name: str
    peak_flops: float  # dense fp32/TF32 FLOP/s per rank
    peak_flops_amp: float  # fp16/bf16 FLOP/s per rank
    mem_bw: float  # device memory bytes/s
    intra_bw: float  # bytes/s one rank sends inside a node (NVLink, per direction)
    inter_bw: float  # bytes/s one rank sends to other nodes (network)
    ranks_per_node: int = 8
    latency_s: float = 20e-6  # per collective call
    gemm_efficiency: float = 0.6  # fraction of peak the MLP GEMMs reach
    mem_efficiency: float = 0.8  # fraction of peak bandwidth gathers and streams reach


# Vendor data sheets: A100 SXM4 80GB (TF32 156 TFLOP/s, FP16 312, HBM2e 2.04 TB/s, NVLink3 600
# GB/s both directions, HDR 200 Gb/s per GPU); H100 SXM5 (TF32 495 dense, BF16 989, HBM3 3.35
# TB/s, NVLink4 900 GB/s both directions, NDR 400 Gb/s per GPU).
PROFILES: dict[str, HardwareProfile] = {
    "a100-80gb": HardwareProfile("a100-80gb", 156e12, 312e12, 2.039e12, 300e9, 25e9),
    "h100": HardwareProfile("h100", 495e12, 989e12, 3.35e12, 450e9, 50e9),
}

# Published anchors (NVIDIA DeepLearningExamples DLRM, PyTorch, Criteo 1TB FL15 "small" model:
# dim 128, bottom 512-256-128, top 1024-1024-512-256-1, global batch 64K).
ANCHORS = [
    dict(label="1x A100-80GB TF32", hardware="a100-80gb", world_size=1, precision="fp32", samples_per_s=2.88e6),
    dict(label="1x A100-80GB AMP", hardware="a100-80gb", world_size=1, precision="amp", samples_per_s=4.02e6),
    dict(label="8x A100-80GB AMP", hardware="a100-80gb", world_size=8, precision="amp", samples_per_s=16.5e6),
]


def mlp_for_dim(dim: int) -> tuple[list[int], list[int]]:
    """MLP shapes the presets use at this width (mlperf at 128, criteo-kaggle at 16)."""
    if dim == 16:
        return [512, 256, 64, 16], [512, 256, 1]
    return [512, 256, dim], [1024, 1024, 512, 256, 1]


def load_profile(spec: str) -> HardwareProfile:
    """A shipped profile name, 'measured' (this machine), or a JSON file with the fields."""
    if spec in PROFILES:
        return PROFILES[spec]
    if spec == "measured":
        return measure_here()
    try:
        with open(spec, encoding="utf-8") as f:
            profile = HardwareProfile(**json.load(f))
    except OSError:
        raise DlrmkitError(
            f"--hardware: '{spec}' is not one of {', '.join(PROFILES)}, 'measured', or a readable JSON file"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise DlrmkitError(f"--hardware {spec}: not a hardware profile ({exc})") from None
    for name, value in vars(profile).items():  # every figure a finite positive number
        if name == "name":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise DlrmkitError(f"--hardware {spec}: '{name}' must be a positive number, got {value!r}")
        if name.endswith("efficiency") and value > 1:
            raise DlrmkitError(f"--hardware {spec}: '{name}' must be at most 1, got {value!r}")
    if not isinstance(profile.ranks_per_node, int):
        raise DlrmkitError(f"--hardware {spec}: 'ranks_per_node' must be an integer")
    return profile


def measure_here(size: int = 1024) -> HardwareProfile:
    """This machine as one 'node' of ranks: GEMM FLOP/s, memory copy bandwidth, and (no
    interconnect) the copy bandwidth again for the links, as for processes sharing memory."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    t0 = time.perf_counter()
    for _ in range(5):
        torch.mm(a, b)
    flops = 5 * 2 * size**3 / (time.perf_counter() - t0)
    x = torch.empty(64 << 18)  # 64 MiB
    y = torch.empty_like(x)
    y.copy_(x)
    t0 = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    bw = 5 * 2 * x.numel() * 4 / (time.perf_counter() - t0)
    try:
        bf = torch.randn(size, size, dtype=torch.bfloat16)
        torch.mm(bf, bf)
        t0 = time.perf_counter()
        for _ in range(5):
            torch.mm(bf, bf)
        amp = 5 * 2 * size**3 / (time.perf_counter() - t0)
    except RuntimeError:
        amp = flops
    return HardwareProfile(
        "measured",
        flops,
        amp,
        bw,
        bw / 2,
        bw / 2,
        ranks_per_node=1 << 20,
        latency_s=50e-6,
        gemm_efficiency=1.0,
        mem_efficiency=1.0,
    )


def dense_costs(
    dim: int, num_tables: int, num_numerical: int = 13, cross: tuple[int, int | None] | None = None
) -> tuple[int, int, int]:
    """(FLOPs per sample fwd+bwd, activation values per sample, MLP parameters); `cross`:
    (layers, rank) of a DCNv2 cross network in place of the dot interaction."""
    from dlrmkit.model.dlrm import ModelConfig, flops_per_sample

    bottom, top = mlp_for_dim(dim)
    t = num_tables + 1
    if cross is None:
        cfg = ModelConfig(num_numerical, [10] * num_tables, dim, bottom, top)
        top_in = dim + t * (t - 1) // 2
        acts = sum(bottom) + sum(top) + t * dim + t * t + top_in
        extra = 0
    else:
        layers, rank = cross
        cfg = ModelConfig(num_numerical, [10] * num_tables, dim, bottom, top, "dcn", dcn_layers=layers, dcn_rank=rank)
        top_in = t * dim  # each layer's U V x (or W x) and its output, on top of x_0
        acts = sum(bottom) + sum(top) + top_in + layers * ((rank or top_in) + 2 * top_in)
        extra = layers * ((2 * top_in * rank if rank else top_in * top_in) + top_in)
    sizes_b, sizes_t = [num_numerical] + bottom, [top_in] + top
    params = sum(a * b + b for a, b in zip(sizes_b[:-1], sizes_b[1:])) + sum(
        a * b + b for a, b in zip(sizes_t[:-1], sizes_t[1:])
    )
    return flops_per_sample(cfg), acts, params + extra


def simulate(plan, hw: HardwareProfile, precision: str = "fp32", cross: tuple[int, int | None] | None = None) -> dict:
    """Estimated step of `plan` on `hw`: seconds per phase for the slowest rank, samples/s and
    the communication share. `precision` amp halves activation and all-to-all bytes and uses
    the fp16/bf16 peak. Multi-hot tables (TablePlan.bag) count each id's row; `cross`: the
    (layers, rank) of a DCNv2 interaction."""
    n, g = plan.world_size, plan.batch_size
    dim, tables = plan.tables[0].dim, len(plan.tables)
    amp = precision in ("amp", "bf16", "fp16")
    act_bytes = 2 if amp else 4
    flops, acts, params = dense_costs(dim, tables, cross=cross)
    peak = (hw.peak_flops_amp if amp else hw.peak_flops) * hw.gemm_efficiency
    mem = hw.mem_bw * hw.mem_efficiency
    # communication links: the share of a rank's peers in other nodes goes over the network
    cross = 0.0 if n <= hw.ranks_per_node else (n - hw.ranks_per_node) / (n - 1)
    link = 1.0 / ((1 - cross) / hw.intra_bw + cross / hw.inter_bw) if n > 1 else math.inf
    ring = hw.intra_bw if n <= hw.ranks_per_node else hw.inter_bw  # the slowest hop sets a ring's pace
    stats = plan.rank_stats()
    worst = None
    for st in stats:
        local = g // n + (1 if st["rank"] < g % n else 0)
        compute = local * flops / peak + local * acts * act_bytes * 6 / mem
        # forward reads pooled rows; backward reads gradient rows, reads and writes table rows: each
        # id of a bag, at its shard's width (a column slice reads its columns only, a row range its ids only)
        lookups = st["lookup_bytes"] * 4 / mem  # CostModel.lookup_bytes: the rows forward reads
        a2a = st["sent_bytes"] * (act_bytes / 4) / link if n > 1 else 0.0
        allreduce = 2 * (n - 1) / n * params * 4 / ring if n > 1 else 0.0
        latency = (4 + math.ceil(params * 4 / (25 << 20))) * hw.latency_s * (1 + math.log2(max(n, 1))) if n > 1 else 0.0
        phases = dict(
            compute=compute, lookups=lookups, all_to_all=a2a + latency / 2, all_reduce=allreduce + latency / 2
        )
        total = sum(phases.values())
        if worst is None or total > worst[0]:
            worst = (total, phases)
    total, phases = worst
    comm = phases["all_to_all"] + phases["all_reduce"]
    return dict(
        world_size=n,
        batch_size=g,
        hardware=hw.name,
        precision=precision,
        step_s=total,
        samples_per_s=g / total,
        comm_share=comm / total,
        phases=phases,
    )


def simulate_scaling(
    rows: list[int],
    dim: int,
    hw: HardwareProfile,
    world_sizes: list[int],
    batch_size: int,
    precision: str = "fp32",
    sharding: str = "auto",
    weak: bool = False,
    bags: list[int] | None = None,
    cross: tuple[int, int | None] | None = None,
) -> list[dict]:
    """simulate() for a fresh plan at each world size; `weak`: batch_size is per rank; `bags`:
    ids per sample of each table (multi-hot); `cross`: a DCNv2 interaction's (layers, rank)."""
    from dlrmkit.parallel.plan import make_plan

    out = []
    for n in world_sizes:
        g = batch_size * n if weak else batch_size
        if g < n:
            raise DlrmkitError(f"global batch {g} is smaller than world size {n}")
        plan = make_plan(rows, dim, n, sharding, None, g, bags=bags)
        out.append(simulate(plan, hw, precision, cross))
    return out


def anchor_errors(rows: list[int], dim: int) -> list[dict]:
    """The simulator's estimate next to each published anchor, with the relative error."""
    out = []
    for a in ANCHORS:
        est = simulate_scaling(rows, dim, PROFILES[a["hardware"]], [a["world_size"]], 65536, a["precision"])[0]
        out.append(dict(a, estimate=est["samples_per_s"], error=est["samples_per_s"] / a["samples_per_s"] - 1))
    return out


def format_table(results: list[dict]) -> str:
    lines = [
        f"{'ranks':>6} {'batch':>8} {'step ms':>9} {'samples/s':>14} {'comm':>6}  compute/lookups/a2a/allreduce ms"
    ]
    for r in results:
        p = r["phases"]
        lines.append(
            f"{r['world_size']:>6} {r['batch_size']:>8} {r['step_s'] * 1e3:>9.3f} {r['samples_per_s']:>14,.0f} "
            f"{100 * r['comm_share']:>5.1f}%  " + "/".join(f"{v * 1e3:.3f}" for v in p.values())
        )
    return "\n".join(lines)
