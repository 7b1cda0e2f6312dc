"""YAML from elsewhere, read with bounds: `yaml.safe_load` never runs code, but anchors and
aliases let a few hundred bytes stand for billions of values (an "alias bomb" that any later
walk of the document, e.g. a JSON dump, expands), an alias may point into itself, and deep
nesting exhausts the recursive composer. The document's events are scanned first, without
building it, and one that is too large once expanded, too deep or self-referencing is refused."""

from __future__ import annotations

from typing import Any

import yaml

from dlrmkit.errors import DlrmkitError

MAX_DEPTH = 64  # nested mappings/lists; a FeatureSpec needs 4
MAX_NODES = 2_000_000  # values once every alias is expanded (Criteo's spec: ~300)


def _check_events(text: str, where: str) -> None:
    nodes = 0
    open_at: list[tuple[str | None, int]] = []  # (anchor, node count at start) of each open collection
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to

    def fail(ev: yaml.Event, what: str) -> None:
        line = f" line {ev.start_mark.line + 1}:" if ev.start_mark is not None else ""
        raise DlrmkitError(f"{where}:{line} {what}")

    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, yaml.AliasEvent):
            if ev.anchor not in sizes:
                fail(ev, f"alias *{ev.anchor} refers to a value that contains it (a self-referencing document)")
            nodes += sizes[ev.anchor]
        elif isinstance(ev, yaml.ScalarEvent):
            nodes += 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.CollectionStartEvent):
            nodes += 1
            open_at.append((ev.anchor, nodes))
            if len(open_at) > MAX_DEPTH:
                fail(ev, f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(ev, yaml.CollectionEndEvent):
            anchor, start = open_at.pop()
            if anchor:
                sizes[anchor] = nodes - start + 1
        if nodes > MAX_NODES:
            fail(ev, f"more than {MAX_NODES:,} values once its aliases (*name) are expanded")


def load_yaml(text: str, where: str) -> Any:
    """`yaml.safe_load(text)` after the bounds above; `where` names the file in errors. YAML
    syntax errors propagate as yaml.YAMLError (callers word them)."""
    _check_events(text, where)
    return yaml.safe_load(text)
