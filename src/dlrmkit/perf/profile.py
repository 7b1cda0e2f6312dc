"""`dlrmkit bench --profile`: where a training step's time goes, from torch.profiler.

The model is instrumented from outside (principle 1: `model/` knows nothing of profiling):
`instrument` wraps the forward of the bottom MLP, embeddings, interaction and top MLP, and the
step's backward, gradient all-reduce and optimizer calls, in `record_function` ranges on the
instances only. Collectives are recognised by the c10d/gloo/nccl op names the profiler records.
`breakdown` assigns every microsecond of the profiled steps to the innermost named range
active at that time (so an all-to-all inside the embedding lookup counts as all-to-all, not as
lookup), which makes the shares add up to 100% with "other" for unlabelled time."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.profiler import record_function

# the phases of a step, in the order they are printed
PHASES = [
    "data_loading",
    "embedding_lookup",
    "all_to_all",
    "bottom_mlp",
    "interaction",
    "top_mlp",
    "backward",
    "all_reduce",
    "optimizer",
    "other",
]
PREFIX = "dlrmkit::"
STEP = PREFIX + "step"  # one range per profiled step: data loading + the training step


@dataclass(frozen=True)
class Interval:
    phase: str
    start: float  # microseconds
    end: float


def phase_of(name: str) -> str | None:
    """The phase of a profiler event name, or None for events that are not phase markers."""
    if name.startswith(PREFIX):
        phase = name[len(PREFIX) :]
        return phase if phase in PHASES else None
    low = name.lower()
    if "alltoall" in low or "all_to_all" in low:
        return "all_to_all"
    if "allreduce" in low or "all_reduce" in low:
        return "all_reduce"
    if name.startswith("autograd::engine::evaluate_function"):
        return "backward"  # one event per autograd node; comm and phase ranges inside win
    return None


def breakdown(intervals: list[Interval], total: float | None = None, start: float | None = None) -> dict[str, float]:
    """Seconds-agnostic share of each phase: every instant in [start, start + total) goes to the
    innermost interval covering it (latest start; the shorter one on a tie), time covered by
    none goes to "other". Returns {phase: fraction} over PHASES, summing to 1."""
    if not intervals and not total:
        return {p: 0.0 for p in PHASES}
    lo = min(i.start for i in intervals) if start is None else start
    hi = (max(i.end for i in intervals) if total is None else lo + total) if intervals or total else lo
    span = hi - lo
    times = sorted({lo, hi, *(min(max(t, lo), hi) for i in intervals for t in (i.start, i.end))})
    acc = {p: 0.0 for p in PHASES}
    for a, b in zip(times[:-1], times[1:]):
        if b <= a:
            continue
        mid = (a + b) / 2
        active = [i for i in intervals if i.start <= mid < i.end]
        phase = max(active, key=lambda i: (i.start, -(i.end - i.start))).phase if active else "other"
        acc[phase] += b - a
    return {p: (acc[p] / span if span > 0 else 0.0) for p in PHASES}


def _wrap(obj, attr: str, phase: str) -> None:
    """Replace `obj.attr` (a bound method) on the instance with one that runs in a named range."""
    fn = getattr(obj, attr)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with record_function(PREFIX + phase):
            return fn(*args, **kwargs)

    setattr(obj, attr, wrapped)


def instrument(model: torch.nn.Module, optimizers: list, parallel=None) -> None:
    """Adds phase ranges to this model, these optimizers and (under torchrun) the hybrid-parallel
    wrapper. Affects these instances only; the added ranges cost ~1 us each when not profiling."""
    for attr, phase in (
        ("bottom_mlp", "bottom_mlp"),
        ("embeddings", "embedding_lookup"),
        ("interaction", "interaction"),
        ("top_mlp", "top_mlp"),
    ):
        module = getattr(model, attr, None)
        if module is not None:
            _wrap(module, "forward", phase)
    for opt in optimizers:
        _wrap(opt, "step", "optimizer")
    if parallel is not None:
        make = parallel.make_step

        def make_instrumented(*args, **kwargs):  # the hybrid step's gradient sum, in its own range
            step = make(*args, **kwargs)
            _wrap(step.gradients, "wait", "all_reduce")
            return step

        parallel.make_step = make_instrumented


def phase_range(phase: str):
    """A named range for a phase the caller runs itself (data loading, backward)."""
    return record_function(PREFIX + phase)


def intervals_from_events(events) -> tuple[list[Interval], list[Interval]]:
    """(phase intervals, step intervals) from torch.profiler FunctionEvents."""
    phases, steps = [], []
    for ev in events:
        tr = ev.time_range
        if ev.name == STEP:
            steps.append(Interval("step", tr.start, tr.end))
            continue
        phase = phase_of(ev.name)
        if phase is not None:
            phases.append(Interval(phase, tr.start, tr.end))
    return phases, steps


def step_breakdown(events) -> tuple[dict[str, float], float]:
    """Shares of each phase over the profiled steps, and the mean step time in seconds."""
    phases, steps = intervals_from_events(events)
    if not steps:
        raise ValueError(f"no {STEP} ranges among the profiler events")
    acc = {p: 0.0 for p in PHASES}
    total = 0.0
    for s in steps:
        inside = [
            Interval(i.phase, max(i.start, s.start), min(i.end, s.end))
            for i in phases
            if i.end > s.start and i.start < s.end
        ]
        span = s.end - s.start
        for p, f in breakdown(inside, span, s.start).items():
            acc[p] += f * span
        total += span
    return {p: acc[p] / total for p in PHASES}, total / len(steps) / 1e6


def profile_steps(step, next_batch, steps: int, trace: str | None = None, warmup: int = 1):
    """Runs `warmup` untraced steps, then `steps` steps under torch.profiler (CPU activities,
    plus CUDA when present), each in a "dlrmkit::step" range with `next_batch()` inside a
    data-loading range; writes a Chrome trace (open in ui.perfetto.dev or chrome://tracing)
    when `trace` is given. Returns (shares, mean step seconds)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step(next_batch())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function(STEP):
                with phase_range("data_loading"):
                    batch = next_batch()
                step(batch)
    if trace:
        from dlrmkit.atomic_io import atomic_path

        with atomic_path(trace) as tmp:
            prof.export_chrome_trace(tmp)
    return step_breakdown(prof.events())


def format_breakdown(shares: dict[str, float], step_s: float, title: str = "step breakdown") -> str:
    lines = [f"{title} (torch.profiler, mean step {step_s * 1e3:.1f} ms):"]
    for p in PHASES:
        lines.append(f"  {p:<17} {100 * shares.get(p, 0.0):5.1f}%  {shares.get(p, 0.0) * step_s * 1e3:8.2f} ms")
    return "\n".join(lines)
