"""--time-limit: the wall-clock minutes a searched run (--preset auto) aims its training at (by
default on the small-data base, up to 100,000 training rows: dlrmkit.train.recipe). The search
tries the candidates after the first only while the run has spent less than SEARCH_SHARE of the
limit, and a candidate's training (without --folds, --epochs or --max-steps given) ends at an
epoch end by RUN_SHARE of it, the candidate then being the candidate of the epochs it trained.
Once the search has chosen, a blend's optional training is timed from the search's own runs of
its members and left out where it would pass the limit: first the members' second seeds
(--blend-seeds 1), then their refits (--refit false: each member is its search run, or with
--folds its fold models); a single choice whose refit would pass it is its search run. Options
the user gave are kept. What is left out is printed, and config.yaml records what ran, so
`train --config` repeats it without the limit deciding again."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# the share of the limit the search may start candidates in: what the blend adds after it can be
# left out, and the candidate started last ends within about a quarter of the limit on a 46,000-row
# log of 80 columns (docs/BENCHMARKS.md)
SEARCH_SHARE = 0.75
# the share of the limit a candidate's training ends by: it stops at the first epoch end where
# another epoch as long as the last would pass it, and is then the candidate of the epochs it
# trained (recipe_search.cut); the rest is for the temperature, the blend's scoring and the outputs
RUN_SHARE = 0.9
# a refit's time is estimated as its run's, scaled by the share of the run's steps it repeats and by
# its rows (the training and validation rows against the training rows), plus this share of the
# run for building its model again (a regression's refit repeats no step, but fits its start)
REFIT_SETUP = 0.15


@dataclass(frozen=True)
class Clock:
    """The run's wall clock since its recipe began to be chosen, against `limit` seconds (0: no limit)."""

    limit: float
    start: float

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def search_open(self) -> bool:
        """Whether the search may start another candidate."""
        return not self.limit or self.spent() < SEARCH_SHARE * self.limit

    def deadline(self) -> float | None:
        """The time.perf_counter() value a candidate's training ends by (Trainer.fit), or None."""
        return self.start + RUN_SHARE * self.limit if self.limit else None

    def option(self) -> str:
        """The limit, as the lines that name it print it."""
        return f"--time-limit ({self.limit / 60:g} min)"

    def skipped(self, name: str) -> str:
        """The line for a candidate the search does not try."""
        return f"  {name:<26} not tried: the run had spent {self.spent():.0f} s, past {SEARCH_SHARE:.0%} of {self.option()}"

    def ended(self, name: str) -> str:
        """The line for a candidate whose training the deadline ended."""
        return f"  {name:<26} ended by the time limit: its training stopped at an epoch end past {RUN_SHARE:.0%} of {self.option()}"


def run_seconds(candidate: Any) -> float:
    """The seconds of one of a candidate's runs (its search figure, over its folds' runs)."""
    runs = len(candidate.trained) if candidate.trained else 1
    return candidate.result.get("seconds", 0.0) / runs


def refit_seconds(candidate: Any) -> float:
    """A refit's estimated seconds: its run's, times the share of the run's steps up to the one
    selection chose times the training and validation rows over the training rows (every refit
    trains on both), plus REFIT_SETUP of it."""
    if not candidate.trained:
        return run_seconds(candidate)
    trainer, _, metrics = candidate.trained[0][:3]
    share = metrics["selected_step"] / metrics["steps"] if metrics["steps"] else 0.0
    train = len(trainer.train_set)
    rows = (train + (len(trainer.val_set) if trainer.val_set is not None else 0)) / max(train, 1)
    return run_seconds(candidate) * (REFIT_SETUP + share * rows)


@dataclass(frozen=True)
class BlendTime:
    """A blend's optional training, estimated: its members' second seeds (each a run, and its refit
    where the blend refits; with --folds, a refit only), and the refits of their first seeds."""

    seeds: float
    refits: float


def blend_time(runs: dict[str, int], tried: list[Any], refitting: bool, folds: bool) -> BlendTime:
    """`runs`: {member: its runs with the default seeds}, the candidates `tried` by name."""
    by_name = {c.name: c for c in tried}
    seeds = refits = 0.0
    for name, n in runs.items():
        c = by_name[name]
        refit = refit_seconds(c) if refitting else 0.0
        seeds += (n - 1) * (refit if folds else run_seconds(c) + refit)
        refits += refit
    return BlendTime(seeds, refits)


def trim(clock: Clock, cost: BlendTime, seeds_given: bool, refit_given: bool) -> tuple[bool, bool, list[str]]:
    """(drop the second seeds, drop the refits, the lines saying so) for a blend whose optional
    training `cost` would take the run past the clock's limit: the seeds first, then the refits;
    options given are kept."""
    if not clock.limit:
        return False, False, []
    spent, lines = clock.spent(), []
    drop_seeds = not seeds_given and cost.seeds > 0 and spent + cost.seeds + cost.refits > clock.limit
    if drop_seeds:
        lines.append(
            f"  time limit: each member trained on one seed (--blend-seeds 1): the run had spent {spent:.0f} s, and "
            f"the second seeds (about {cost.seeds:.0f} s) with the refits (about {cost.refits:.0f} s) would pass "
            f"{clock.option()}"
        )
    drop_refits = not refit_given and cost.refits > 0 and spent + cost.refits > clock.limit
    if drop_refits:
        lines.append(
            f"  time limit: no refit (--refit false), each member kept as the search trained it: the run had spent "
            f"{spent:.0f} s, and the refits (about {cost.refits:.0f} s) would pass {clock.option()}"
        )
    return drop_seeds, drop_refits, lines


def unrefitted(clock: Clock, name: str, refit: float, refit_given: bool) -> list[str]:
    """The line for a single choice, `name`, whose refit (about `refit` seconds) would take the
    run past the clock's limit: the run is then the search's run of it; [] where the refit fits,
    or --refit was given."""
    spent = clock.spent()
    if not clock.limit or refit_given or spent + refit <= clock.limit:
        return []
    return [
        f"  time limit: no refit (--refit false), the run is the search's run of {name} (--blend '{name}=1'): the "
        f"run had spent {spent:.0f} s, and the refit (about {refit:.0f} s) would pass {clock.option()}"
    ]
