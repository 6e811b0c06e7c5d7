"""The README and docs/ against the code: length and first lines, links, paths, settings,
benchmark commands. Each check reads the files as a reader would and fails on what would
mislead one."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from fusecut import environment
from fusecut.service.settings import Settings, variable
from tests import rooms

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")

FIRST_BLOCK = [
    "```sh",
    "make run    # start the service on 127.0.0.1:8000 with its embedded defaults (CPU path "
    "without a GPU)",
    "make test   # create/update .venv and run the whole test suite (about 40 minutes on 2 cores)",
    "make test-quick   # the planner, the CLI, the service and the docs: under 5 minutes",
    "```",
]


def prose(path: Path) -> str:
    """The page without its fenced code blocks (code is not links)."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", prose(path), re.M)}


# ---- the README ---------------------------------------------------------------------------------

def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_readme_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# "), "the README opens with its title"
    body = [line for line in lines[1:] if line.strip()]
    assert body[:5] == FIRST_BLOCK, "after the title: the make run / make test block, exactly"
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"run", "test", "test-quick"} <= set(targets), \
        "the Makefile must have the targets the README runs"


def test_readme_links_every_docs_page():
    linked = {(README.parent / target.split("#")[0]).resolve()
              for target in LINK.findall(prose(README))}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


# ---- links and paths ----------------------------------------------------------------------------

def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    assert relative_links(page) or page.name == "ops.md", f"{page.name} links nothing"
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page.resolve()
        if not dest.is_relative_to(ROOT) or not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing in this repository: {broken}"


ROOM_PATH = re.compile(r"(?<![\w./-])(?:clients|optimizer|codegen|runtime|service)/[\w./-]*")


def test_every_room_path_in_the_architecture_page_exists():
    text = (DOCS / "architecture.md").read_text()
    paths = {p.rstrip(".,;:") for p in ROOM_PATH.findall(text)}
    assert len(paths) >= 50, "the concept map names the files"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_architecture_page_names_every_package():
    text = (DOCS / "architecture.md").read_text()
    # each room (optimizer/) and each package in it (optimizer/ir/, clients/thunder/)
    packages = [f"{p.parent.relative_to(ROOT)}/" for p in rooms.source_files()
                if p.name == "__init__.py"]
    assert len(packages) > 10
    missing = [name for name in packages if name not in text]
    assert not missing, f"packages docs/architecture.md leaves out: {missing}"


# ---- settings -----------------------------------------------------------------------------------

def settings_table(text: str | None = None) -> dict[str, list[str]]:
    """docs/service.md's one table of FUSECUT_* variables: variable -> its cells."""
    text = (DOCS / "service.md").read_text() if text is None else text
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`(FUSECUT_\w+)`", cells[0]) if line.startswith("|") else None
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = cells
    return rows


def disagreements(documented: set[str]) -> list[str]:
    declared = set(environment.VARIABLES)
    return [*(f"declared in fusecut.environment, not in docs/service.md: {n}"
              for n in sorted(declared - documented)),
            *(f"in docs/service.md, not declared in fusecut.environment: {n}"
              for n in sorted(documented - declared))]


def test_the_settings_table_has_every_declared_variable_and_no_other():
    wrong = disagreements(set(settings_table()))
    assert not wrong, "\n".join(wrong)


def test_the_table_check_sees_a_missing_and_an_undeclared_row():
    text = (DOCS / "service.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `FUSECUT_NATIVE` |"))
    edited = text.replace(row, row.replace("FUSECUT_NATIVE", "FUSECUT_NATIV"))
    assert disagreements(set(settings_table(edited))) == [
        "declared in fusecut.environment, not in docs/service.md: FUSECUT_NATIVE",
        "in docs/service.md, not declared in fusecut.environment: FUSECUT_NATIV"]


def test_every_setting_is_a_declared_variable_of_its_type():
    service = {n: v for n, v in environment.VARIABLES.items() if v.reader == environment.SERVICE}
    fields = {variable(f.name): f for f in dataclasses.fields(Settings)}
    assert set(service) == set(fields)
    for name, f in fields.items():
        declared = service[name]
        optional = " | None" if declared.default is None else ""
        assert f.type == declared.type.__name__ + optional, (name, f.type, declared.type)


@pytest.mark.parametrize("name", sorted(environment.VARIABLES))
def test_each_variable_has_its_reader_and_default(name, monkeypatch):
    declared = environment.declared(name)
    cells = settings_table()[name]
    assert len(cells) == 4 and cells[3], f"{name}: variable | read by | default | meaning"
    reader = f"Settings.{name.removeprefix('FUSECUT_').lower()}" \
        if declared.reader == environment.SERVICE else declared.reader
    assert cells[1] == f"`{reader}`", f"{name}: read by {reader}, docs/service.md: {cells[1]}"
    spans = CODE_SPAN.findall(cells[2])
    assert spans, f"{name}: the default as a Python literal in backticks"
    written = ast.literal_eval(spans[0])
    # a default under a per-user folder, as the page writes it
    monkeypatch.setattr(environment, "user_data_dir", lambda: Path("$XDG_DATA_HOME/fusecut"))
    monkeypatch.setattr(environment, "user_cache_dir", lambda: Path("$XDG_CACHE_HOME/fusecut"))
    monkeypatch.setattr(environment, "install_tag", lambda: "$VERSION-$CHECKOUT")
    default = environment.default(name)
    if isinstance(default, Path):
        default = str(default)
    assert written == default and type(written) is type(default), (
        f"{name}: docs/service.md says {spans[0]}, the code has {default!r}")


@pytest.mark.parametrize("field", dataclasses.fields(Settings), ids=lambda f: f.name)
def test_the_documented_variable_is_the_one_read(field, monkeypatch):
    for f in dataclasses.fields(Settings):
        monkeypatch.delenv(variable(f.name), raising=False)
    default = getattr(Settings(), field.name)
    if isinstance(default, bool):
        raw, expected = ("0", False) if default else ("1", True)
    elif isinstance(default, int):
        raw, expected = str(default + 3), default + 3
    elif isinstance(default, float):
        raw, expected = str(default + 1.5), default + 1.5
    else:
        raw = expected = "documented-value"
    [name] = [n for n, cells in settings_table().items() if cells[1] == f"`Settings.{field.name}`"]
    monkeypatch.setenv(name, raw)
    assert getattr(Settings.from_env(), field.name) == expected


def test_every_fusecut_variable_named_in_the_docs_exists():
    names = set()
    for page in PAGES:
        names |= set(re.findall(r"\bFUSECUT_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()))
    code = "\n".join(p.read_text() for p in [*rooms.source_files(),
                                             *(ROOT / "docker").rglob("*.y*ml")])
    unknown = sorted(n for n in names - set(environment.VARIABLES) if n not in code)
    assert not unknown, f"the docs name variables nothing reads: {unknown}"


# ---- benchmarks ---------------------------------------------------------------------------------

def benchmark_commands() -> set[str]:
    return {m for page in PAGES
            for m in re.findall(r"python -m benchmarks\.(\w+)", page.read_text())}


def test_every_benchmark_command_in_the_docs_exists():
    named = benchmark_commands()
    assert named
    missing = sorted(n for n in named if not (ROOT / "benchmarks" / f"{n}.py").exists())
    assert not missing, f"the docs run benchmarks that do not exist: {missing}"


def test_every_runnable_benchmark_is_documented():
    runnable = {p.stem for p in (ROOT / "benchmarks").glob("*.py")
                if '__name__ == "__main__"' in p.read_text()}
    text = (DOCS / "benchmarks.md").read_text()
    missing = sorted(n for n in runnable if f"python -m benchmarks.{n}" not in text)
    assert not missing, f"docs/benchmarks.md lacks: {missing}"


# ---- code snippets ------------------------------------------------------------------------------

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def undefined_names(source: str) -> set[str]:
    """Names a snippet reads that it neither imports, assigns nor gets from builtins."""
    import builtins

    tree = ast.parse(source)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)} - defined


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_snippets_define_what_they_use(page: Path):
    # issue 32: the README's client snippet ended with fd.execute(inputs, remote=...), with no
    # fd and no inputs anywhere in it
    for block in PYTHON_BLOCK.findall(page.read_text()):
        assert not undefined_names(block), (page.name, undefined_names(block), block)


def test_the_undefined_names_check_finds_them():
    assert undefined_names("x = 1\nfd.execute(inputs, remote=x)\n") == {"fd", "inputs"}
    assert not undefined_names("import torch\nwith open('f') as fd:\n    torch.x(fd)\n")


def test_what_the_readme_writes_is_ignored_by_git():
    # issue 32: `fusecut codegen ... --out kernels/` (the README's command) left kernels/
    # untracked
    import subprocess

    assert "--out kernels/" in README.read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", "kernels/segment0_pointwise.cu"],
                             cwd=ROOT, capture_output=True)
    if ignored.returncode == 128:  # not a git checkout
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, "kernels/ is not in .gitignore"
