"""matplotlib figures for benchmarks: throughput and step-breakdown bars of one `dlrmkit bench`
result, and scaling curves from a JSON list of runs (`python -m dlrmkit.perf.plots runs.json
out.png`). matplotlib is imported lazily (the `report` extra)."""

from __future__ import annotations

import json
import sys

from dlrmkit.errors import DlrmkitError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DlrmkitError("plots need matplotlib: pip install -c constraints.txt 'dlrmkit[report]'") from None
    return plt


def plot_bench(result: dict, path: str) -> None:
    """Left: samples/s of dlrmkit, the reference loop and the compute bound. Right: the share
    of a step in each phase (when the result has a profile)."""
    from dlrmkit.perf.profile import PHASES

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    bars = {"dlrmkit": result["samples_per_s"]}
    if "reference_samples_per_s" in result:
        bars["plain PyTorch"] = result["reference_samples_per_s"]
    if "compute_bound_samples_per_s" in result:
        bars["compute bound"] = result["compute_bound_samples_per_s"]
    ax1.bar(list(bars), list(bars.values()), color=["C0", "C1", "C7"][: len(bars)])
    ax1.set_ylabel("samples/s")
    ax1.set_title(f"{result.get('model', '')} batch {result.get('batch_size', '')} {result.get('precision', '')}")
    shares = result.get("profile_shares") or {}
    phases = [p for p in PHASES if shares.get(p, 0) > 0]
    ax2.barh(phases, [100 * shares[p] for p in phases], color="C2")
    ax2.invert_yaxis()
    ax2.set_xlabel("% of step")
    ax2.set_title("step breakdown" if phases else "step breakdown (no --profile)")
    fig.tight_layout()
    from dlrmkit.atomic_io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def plot_scaling(runs: list[dict], path: str, x: str = "world_size", y: str = "samples_per_s") -> None:
    """One curve per (strategy, kind) over world size; `runs` are bench or simulate results
    (keys world_size, samples_per_s, and optionally sharding/kind/label)."""
    plt = _pyplot()
    if not runs:
        raise DlrmkitError("no runs to plot")
    groups: dict[str, list[tuple[float, float]]] = {}
    for i, r in enumerate(runs):
        try:
            key = r.get("label") or f"{r.get('sharding', '')} {r.get('kind', '')}".strip() or "runs"
            groups.setdefault(key, []).append((float(r[x]), float(r[y])))
        except (KeyError, TypeError, ValueError):
            raise DlrmkitError(f"run {i}: needs numeric '{x}' and '{y}'") from None
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, pts in sorted(groups.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.legend(fontsize=8)
    fig.tight_layout()
    from dlrmkit.atomic_io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dlrmkit.perf.plots RUNS.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        data = json.load(f)
    plot_scaling(data if isinstance(data, list) else data.get("runs", []), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
