"""YAML from elsewhere, read with bounds: `yaml.safe_load` never runs code, but anchors and
aliases let a few hundred bytes stand for billions of values (an "alias bomb" that any later
walk of the document, e.g. a JSON dump, expands), an alias may point into itself, and deep
nesting exhausts the recursive composer. The document's events are scanned first, without
building it, and one that is too large once expanded, too deep, self-referencing or with a key
twice in one mapping (PyYAML would keep the last silently) is refused."""

from __future__ import annotations

from typing import Any

import yaml

from dlrmkit.errors import DlrmkitError

MAX_DEPTH = 64  # nested mappings/lists; a FeatureSpec needs 4
MAX_NODES = 2_000_000  # values once every alias is expanded (Criteo's spec: ~300)


class _Open:
    """A collection being read: its anchor, the node count at its start, and for a mapping
    the keys seen so far and whether the next node is a key."""

    def __init__(self, ev: yaml.CollectionStartEvent, start: int):
        self.anchor, self.start = ev.anchor, start
        self.keys: set[str] | None = set() if isinstance(ev, yaml.MappingStartEvent) else None
        self.at_key = True


def _check_events(text: str, where: str) -> None:
    nodes = 0
    stack: list[_Open] = []
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to

    def fail(ev: yaml.Event, what: str) -> None:
        line = f" line {ev.start_mark.line + 1}:" if ev.start_mark is not None else ""
        raise DlrmkitError(f"{where}:{line} {what}")

    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if stack and stack[-1].keys is not None and isinstance(ev, (yaml.NodeEvent, yaml.CollectionStartEvent)):
            parent = stack[-1]
            if parent.at_key and isinstance(ev, yaml.ScalarEvent):
                if ev.value in parent.keys:  # YAML requires unique keys; PyYAML keeps the last one silently
                    fail(ev, f"key '{ev.value}' appears twice in one mapping")
                parent.keys.add(ev.value)
            parent.at_key = not parent.at_key
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
            stack.append(_Open(ev, nodes))
            if len(stack) > MAX_DEPTH:
                fail(ev, f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(ev, yaml.CollectionEndEvent):
            done = stack.pop()
            if done.anchor:
                sizes[done.anchor] = nodes - done.start + 1
        if nodes > MAX_NODES:
            fail(ev, f"more than {MAX_NODES:,} values once its aliases (*name) are expanded")


def load_yaml(text: str, where: str) -> Any:
    """`yaml.safe_load(text)` after the bounds above; `where` names the file in errors. YAML
    syntax errors propagate as yaml.YAMLError (callers word them)."""
    _check_events(text, where)
    try:
        return yaml.safe_load(text)
    except ValueError as exc:  # a value YAML's constructors cannot convert (an integer of 5,000 digits)
        raise DlrmkitError(f"{where}: a value YAML cannot convert ({str(exc).split(';')[0]})") from None
