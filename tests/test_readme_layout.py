"""README's Layout section names every source file and every doc, so a new module is listed where
readers look for it (the layer table itself lives in tests/test_layers.py)."""

import re
from pathlib import Path

from test_layers import LAYERS

ROOT = Path(__file__).resolve().parent.parent


def layout_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Layout") : text.index("\n## ", text.index("## Layout") + 1)]


def test_layout_lists_every_source_file_and_doc():
    section = layout_section()
    files = [p for p in (ROOT / "src" / "dlrmkit").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    files = [p for p in files if p.name != "__init__.py" and p.suffix in (".py", ".cpp", ".yaml")]
    assert len(files) > 50
    missing = [str(p.relative_to(ROOT)) for p in files if not re.search(rf"\b{re.escape(p.stem)}\b", section)]
    missing += [f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name not in section]
    assert not missing, f"README's Layout section does not name: {missing}"


def test_layout_chain_is_the_layer_table():
    first = layout_section().split("\n\n")[1]
    chain = re.sub(r"\s+", " ", first.split(";")[0]).split(": ", 1)[1]
    names = [re.sub(r" \(.*\)", "", part).strip() for part in chain.split("->")]
    assert names == [name for name, _, _ in LAYERS]
