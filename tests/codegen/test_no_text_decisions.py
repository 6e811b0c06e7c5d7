"""The code generator decides on typed values (codegen.index, codegen.code) and renders them; it
never reads its own text back. Regular expressions and Python's parser were how it used to: a
module of codegen/ importing either is that coming back."""

from __future__ import annotations

import ast
from pathlib import Path

import fusecut.codegen

CODEGEN = Path(fusecut.codegen.__file__).parent
TEXT_READERS = {"re", "ast", "regex", "tokenize"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_no_codegen_module_imports_a_text_reader():
    modules = sorted(CODEGEN.glob("*.py"))
    assert len(modules) > 10
    readers = {p.name: sorted(_imports(p) & TEXT_READERS) for p in modules}
    assert not {name: found for name, found in readers.items() if found}


def test_the_check_finds_an_import_of_re(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import re as regex_module\nfrom ast import parse\n")
    assert _imports(module) & TEXT_READERS == {"re", "ast"}
