"""Layers point one way: every module under src/dlrmkit imports only its own layer or a lower one.

The table below is the one statement of the layer order (docs/ARCHITECTURE.md points here). The
check reads the source with `ast` (it imports nothing), and counts every import: top-level ones
and those inside functions, which keep start-up fast but are dependencies all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "dlrmkit"

# Lowest first: a module may import its own layer and the layers listed before it, never one listed
# after it. Each entry: (layer, module prefixes relative to dlrmkit, why it sits there); the prefix
# "" is the package itself (`dlrmkit/__init__.py`, which holds only the version).
LAYERS: list[tuple[str, tuple[str, ...], str]] = [
    ("errors", ("errors",), "DlrmkitError, the one-line exit-2 error that every layer raises"),
    (
        "base",
        ("", "cli_types", "untrusted", "atomic_io", "metrics", "allocator", "precision", "resources", "options", "faults"),
        "helpers that know nothing of DLRM: option values, safe reads and writes, AUC, autocast, memory figures",
    ),
    ("model", ("model",), "the DLRM for one device: it knows nothing of files, ranks or optimizers"),
    ("optim", ("optim",), "optimizers for the model's fused tables and MLPs; they need no data or ranks"),
    ("data", ("data",), "datasets on disk and their batches; reading or writing them needs no model code"),
    ("device", ("device", "device_options"), "puts the model's tables and the data's batches on a CPU or GPU"),
    ("parallel", ("parallel",), "runs one model over ranks as a plan says; the single-device layers know no ranks"),
    (
        "config",
        ("config", "train.options"),
        "TrainConfig: every train option once, in sections (the training loop's own in train.options), "
        "with presets naming model and optimizer choices",
    ),
    (
        "checkpoint",
        ("checkpoint",),
        "placement-free checkpoints: save, verify and load a model under any plan; no training loop",
    ),
    ("train", ("train",), "the one training step, the loop, evaluation, checkpoints, run folders and logs"),
    ("perf", ("perf",), "tools that measure training and plans; nothing that trains depends on them"),
    (
        "commands",
        ("commands",),
        "one command each, built on training and its files; no layer below calls a command",
    ),
    ("entry", ("cli", "__main__", "cli_reference"), "the `dlrmkit` entry point, which dispatches to the commands"),
]


def layer_of(module: str) -> int | None:
    """Index in LAYERS of `module` (a dotted name under dlrmkit), by its longest matching prefix."""
    rel = module[len(PACKAGE) + 1 :] if module.startswith(PACKAGE + ".") else ("" if module == PACKAGE else None)
    if rel is None:
        return None
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes, _) in enumerate(LAYERS):
        for prefix in prefixes:
            if rel == prefix or (prefix and rel.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[str, int]]:
    """(dlrmkit module, line) for every import in `source`, wherever it sits. `from a import b`
    counts as importing `a.b` when that is a module, else `a`; relative imports are resolved
    against `module`, and `importlib.import_module("dlrmkit...")` with a literal name counts too."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in known else base, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    ours = [(name, line) for name, line in found if name == PACKAGE or name.startswith(PACKAGE + ".")]
    return sorted(set(ours), key=lambda item: (item[1], item[0]))


def upward_imports(source: str, module: str, is_package: bool = False, known: set[str] = frozenset()) -> list[str]:
    """'module -> imported (line N): layer a imports layer b' for each import of a higher layer,
    or of a dlrmkit module that no layer holds."""
    own = layer_of(module)
    if own is None:
        return [f"{module}: in no layer of LAYERS"]
    bad = []
    for name, line in imported_modules(source, module, is_package, known):
        target = layer_of(name)
        if target is None or target > own:
            where = "no layer" if target is None else f"layer {LAYERS[target][0]}"
            bad.append(f"{module} -> {name} (line {line}): layer {LAYERS[own][0]} imports {where}")
    return bad


def source_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def test_no_module_imports_a_higher_layer():
    modules = source_modules()
    assert len(modules) > 50, f"found only {len(modules)} modules under {SRC / PACKAGE}"
    known = set(modules)
    bad = []
    for module, path in modules.items():
        bad += upward_imports(path.read_text(encoding="utf-8"), module, path.name == "__init__.py", known)
    assert not bad, "imports that point up the layers:\n" + "\n".join(bad)


def test_every_module_and_layer_is_used():
    """A module outside the table fails the check above; a layer no module sits in is a stale row."""
    used = {layer_of(m) for m in source_modules()}
    assert None not in used
    assert used == set(range(len(LAYERS))), [LAYERS[i][0] for i in set(range(len(LAYERS))) - used]


def test_the_check_flags_upward_imports_anywhere():
    known = {"dlrmkit.train.run_dir", "dlrmkit.model.mlp", "dlrmkit.data", "dlrmkit.data.loader"}
    source = (
        "from dlrmkit.errors import DlrmkitError\n"  # down: fine
        "import dlrmkit.model.mlp\n"  # same layer: fine
        "def f():\n"
        "    from dlrmkit.train import run_dir\n"  # up, hidden in a function
        "    import dlrmkit.commands.report as r\n"  # up, to a command
        "from ..data import loader\n"  # up, relative
        "importlib.import_module('dlrmkit.parallel.plan')\n"  # up, by name
        "from dlrmkit.nowhere import x\n"  # a module no layer holds
    )
    bad = upward_imports(source, "dlrmkit.model.dlrm", known=known)
    assert [b.split(" (")[0] for b in bad] == [
        "dlrmkit.model.dlrm -> dlrmkit.train.run_dir",
        "dlrmkit.model.dlrm -> dlrmkit.commands.report",
        "dlrmkit.model.dlrm -> dlrmkit.data.loader",
        "dlrmkit.model.dlrm -> dlrmkit.parallel.plan",
        "dlrmkit.model.dlrm -> dlrmkit.nowhere",
    ], bad
    assert "(line 4): layer model imports layer train" in bad[0]
    assert upward_imports(source.split("def f")[0], "dlrmkit.model.dlrm", known=known) == []
    assert upward_imports("", "dlrmkit.newthing") == ["dlrmkit.newthing: in no layer of LAYERS"]


def test_layer_of_takes_the_longest_prefix():
    names = {i: LAYERS[i][0] for i in range(len(LAYERS))}
    assert names[layer_of("dlrmkit")] == "base"
    assert names[layer_of("dlrmkit.cli_types")] == "base"  # not `cli`, a prefix of its name
    assert names[layer_of("dlrmkit.cli")] == "entry"
    assert names[layer_of("dlrmkit.commands.train")] == "commands"
    assert names[layer_of("dlrmkit.train.trainer")] == "train"
    assert layer_of("numpy") is None and layer_of("dlrmkitx") is None


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circle_even_inside_functions():
    modules = source_modules()
    known = set(modules)
    edges = {
        m: {n for n, _ in imported_modules(p.read_text(encoding="utf-8"), m, p.name == "__init__.py", known)} - {m}
        for m, p in modules.items()
    }
    edges = {m: {n for n in targets if n in known} for m, targets in edges.items()}
    assert not import_cycles(edges), f"import circles: {import_cycles(edges)}"
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
