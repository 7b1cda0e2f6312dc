"""The README is the front door: every page in docs/ is reachable from it, and every file a doc
names (a source module, test, benchmark or doc) exists, so moving code cannot leave a stale map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
# a path under one of the project's folders, as docs write them: src/dlrmkit/x.py, tests/y.py,
# benchmarks/z.sh, docs/W.md, or a module path inside the package such as parallel/plan.py
NAMED = re.compile(r"(?<![\w./-])((?:src/dlrmkit|tests|benchmarks|docs)/[\w./-]+\.(?:py|sh|md|yaml|cpp))")
PACKAGE = re.compile(r"(?<![\w./-])((?:model|data|optim|parallel|checkpoint|train|commands|perf)/[\w/]+\.(?:py|cpp))")


def test_readme_links_every_doc_and_stays_short():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 12 * 1024, "README.md is a front door: at most 12 KB"
    missing = [d.name for d in DOCS if f"docs/{d.name}" not in readme]
    assert not missing, f"docs not reachable from README.md: {missing}"


def test_every_file_a_doc_names_exists():
    stale = []
    for doc in [ROOT / "README.md", *DOCS]:
        text = doc.read_text(encoding="utf-8")
        for path in NAMED.findall(text):
            if not (ROOT / path.rstrip(".")).exists():
                stale.append(f"{doc.name}: {path}")
        for path in PACKAGE.findall(text):
            if not (ROOT / "src" / "dlrmkit" / path).exists():
                stale.append(f"{doc.name}: {path}")
    assert not stale, "files named in docs that do not exist:\n" + "\n".join(stale)
