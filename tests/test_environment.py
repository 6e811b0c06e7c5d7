"""One room for the process environment (issue 46, item 3): every FUSECUT_* variable declared
once in fusecut.environment and read through it, one rule for booleans (FUSECUT_NATIVE=off kept
the native launcher on, FUSECUT_COMPILE_AHEAD=false kept compiling ahead on), a bad value an
error naming the variable, per-user folders after XDG."""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fusecut
from fusecut import environment
from fusecut.environment import FALSE, TRUE, VariableError
from fusecut.version import __version__
from tests import rooms

SRC = Path(fusecut.__file__).resolve().parent  # the package's root: clients/ in a checkout


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("FUSECUT_", "XDG_")):
            monkeypatch.delenv(name)
    return monkeypatch


# ---- the rules ----------------------------------------------------------------------------------

def test_one_rule_for_booleans(clean_env):
    for spelling in TRUE + tuple(s.upper() for s in TRUE) + (" Yes ",):
        clean_env.setenv("FUSECUT_NATIVE", spelling)
        assert environment.flag("FUSECUT_NATIVE") is True, spelling
    for spelling in FALSE + tuple(s.upper() for s in FALSE) + (" off ",):
        clean_env.setenv("FUSECUT_NATIVE", spelling)
        assert environment.flag("FUSECUT_NATIVE") is False, spelling
    for blank in ("", "  "):  # set empty: the default
        clean_env.setenv("FUSECUT_METRICS_NEED_KEY", blank)
        assert environment.flag("FUSECUT_METRICS_NEED_KEY") is False


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "nope"])
def test_a_bad_boolean_is_an_error_naming_the_variable_and_the_spellings(clean_env, value):
    clean_env.setenv("FUSECUT_COMPILE_AHEAD", value)
    with pytest.raises(VariableError) as caught:
        environment.flag("FUSECUT_COMPILE_AHEAD")
    assert str(caught.value) == (f"FUSECUT_COMPILE_AHEAD must be one of 1, true, yes, on (true) "
                                 f"or 0, false, no, off (false), got {value!r}")


def test_numbers_parse_as_their_type_or_name_the_variable(clean_env):
    clean_env.setenv("FUSECUT_MAX_OPS", "12")
    assert environment.read("FUSECUT_MAX_OPS") == 12
    clean_env.setenv("FUSECUT_QUEUE_WAIT_S", "2.5")
    assert environment.read("FUSECUT_QUEUE_WAIT_S") == 2.5
    clean_env.setenv("FUSECUT_MAX_OPS", "1.5")
    with pytest.raises(VariableError, match=r"^FUSECUT_MAX_OPS must be a number \(int\), "
                                            r"got '1.5'$"):
        environment.read("FUSECUT_MAX_OPS")
    clean_env.setenv("FUSECUT_MAX_OPS", "")  # set empty: unset
    assert environment.read("FUSECUT_MAX_OPS") == 20_000


def test_text_keeps_its_value_and_an_optional_one_set_empty_is_unset(clean_env):
    clean_env.setenv("FUSECUT_API_KEY", "")
    assert environment.read("FUSECUT_API_KEY") is None
    clean_env.setenv("FUSECUT_API_KEY", "  ")  # blank, not empty: the service refuses it
    assert environment.read("FUSECUT_API_KEY") == "  "


def test_reading_an_undeclared_variable_is_a_programming_error(clean_env):
    clean_env.setenv("FUSECUT_NATIV", "0")
    for read in (environment.read, environment.flag, environment.path, environment.default):
        with pytest.raises(KeyError, match="FUSECUT_NATIV is not declared"):
            read("FUSECUT_NATIV")
    with pytest.raises(KeyError, match="FUSECUT_NATIV is not declared"):
        environment.export("FUSECUT_NATIV", "0")
    with pytest.raises(TypeError, match="FUSECUT_CACHE_DIR is declared Path, not bool"):
        environment.flag("FUSECUT_CACHE_DIR")
    with pytest.raises(TypeError, match="FUSECUT_NATIVE is declared bool, not Path"):
        environment.path("FUSECUT_NATIVE")


def test_check_reads_every_declared_variable(clean_env):
    environment.check()
    clean_env.setenv("FUSECUT_THUNDER_FAST_TRACING", "of")
    with pytest.raises(VariableError, match="^FUSECUT_THUNDER_FAST_TRACING must be one of"):
        environment.check()


def test_snapshot_holds_the_declared_variables_set(clean_env):
    clean_env.setenv("FUSECUT_WORKER", "0")
    clean_env.setenv("FUSECUT_NOT_A_VARIABLE", "1")
    environment.export("FUSECUT_GPUS", "0,1")
    assert environment.snapshot() == {"FUSECUT_WORKER": "0", "FUSECUT_GPUS": "0,1"}


# ---- per-user folders ---------------------------------------------------------------------------

def test_user_folders_follow_xdg(clean_env, tmp_path):
    home = Path.home()
    assert environment.user_data_dir() == home / ".local" / "share" / "fusecut"
    assert environment.user_cache_dir() == home / ".cache" / "fusecut"
    clean_env.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert environment.user_data_dir() == tmp_path / "data" / "fusecut"
    assert environment.user_cache_dir() == tmp_path / "cache" / "fusecut"
    clean_env.setenv("XDG_CACHE_HOME", "relative/cache")  # the specification: ignored
    clean_env.setenv("XDG_DATA_HOME", "")
    assert environment.user_cache_dir() == home / ".cache" / "fusecut"
    assert environment.user_data_dir() == home / ".local" / "share" / "fusecut"


def test_the_three_per_user_paths_are_under_the_xdg_folders(clean_env, tmp_path):
    from fusecut.fusion_cache import default_workspace
    from fusecut.runtime.compile import cache_dir
    from fusecut.service.settings import Settings

    clean_env.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert Settings().db_path == str(tmp_path / "data" / "fusecut" / environment.install_tag() /
                                     "plans.sqlite")
    assert cache_dir() == tmp_path / "cache" / "fusecut" / "kernels"
    assert default_workspace() == tmp_path / "cache" / "fusecut" / "fusion_cache.json"
    clean_env.setenv("FUSECUT_CACHE_DIR", str(tmp_path / "k"))
    clean_env.setenv("FUSECUT_FUSION_CACHE", str(tmp_path / "f.json"))
    clean_env.setenv("FUSECUT_DB_PATH", str(tmp_path / "p.sqlite"))
    assert cache_dir() == tmp_path / "k" and default_workspace() == tmp_path / "f.json"
    assert Settings.from_env().db_path == str(tmp_path / "p.sqlite")


def test_the_install_tag_is_the_one_the_plan_cache_had():
    # moved from service/settings.py, whose parents[1] was this package's folder: an existing
    # plan cache keeps its path
    digest = hashlib.sha256(str(SRC).encode()).hexdigest()[:12]
    assert environment.install_tag() == f"{__version__}-{digest}"


# ---- the readers --------------------------------------------------------------------------------

def test_the_old_spellings_of_off_now_mean_off(clean_env):
    from fusecut.runtime import ahead, launcher
    from fusecut.thunder import fast_tracing

    readers = {"FUSECUT_COMPILE_AHEAD": ahead.enabled, "FUSECUT_NATIVE": launcher.enabled,
               "FUSECUT_THUNDER_FAST_TRACING": fast_tracing.enabled_by_environment}
    for name, enabled in readers.items():
        assert enabled() is True, name
        for spelling in ("false", "off", "No", "0"):  # FUSECUT_COMPILE_AHEAD=false was on
            clean_env.setenv(name, spelling)
            assert enabled() is False, (name, spelling)
        clean_env.setenv(name, "maybe")
        with pytest.raises(VariableError, match=f"^{name} must be one of"):
            enabled()
        clean_env.delenv(name)


def test_each_variable_names_a_reader_that_reads_it():
    from fusecut.service.settings import Settings, variable

    fields = {variable(f.name) for f in __import__("dataclasses").fields(Settings)}
    for name, declared in environment.VARIABLES.items():
        assert declared.meaning and "\n" not in declared.meaning, name
        assert declared.type in (bool, int, float, str, Path), name
        module = rooms.module_path(declared.reader)
        assert module.is_file(), (name, declared.reader)
        if declared.reader == environment.SERVICE:
            assert name in fields, name
        else:
            assert f'"{name}"' in module.read_text(), (name, declared.reader)


def test_the_default_time_limit_is_the_options_declared_default():
    from fusecut.optimizer.options import TIME_LIMIT_S

    assert environment.default("FUSECUT_DEFAULT_TIME_LIMIT_S") == TIME_LIMIT_S.default


# ---- nothing else reads FUSECUT_* from os.environ ----------------------------------------------

ENVIRON = ("environ", "environb", "getenv", "getenvb")
KEYED = ("get", "pop", "setdefault", "__getitem__", "__contains__")


def _environ(node: ast.AST) -> bool:
    """``os.environ`` / ``os.getenv`` (or ``environ`` imported from os)."""
    if isinstance(node, ast.Attribute):
        return node.attr in ENVIRON and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id in ENVIRON


def _bound_strings(tree: ast.AST) -> dict[str, set[str]]:
    """The strings each name is bound to anywhere in a module: ``ENV = "FUSECUT_X"``,
    ``name = f"FUSECUT_{...}"`` (its text before the first brace), and a loop's names over a
    literal of strings or of tuples of them."""
    bound: dict[str, set[str]] = {}

    def bind(target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            bound.setdefault(target.id, set()).update(_strings(value, {}))
        elif isinstance(target, ast.Tuple) and isinstance(value, (ast.Tuple, ast.List)):
            for t, v in zip(target.elts, value.elts):
                bind(t, v)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, (ast.For, ast.comprehension)) and \
                isinstance(node.iter, (ast.Tuple, ast.List)):
            for element in node.iter.elts:
                bind(node.target, element)
    return bound


def _strings(node: ast.AST, bound: dict[str, set[str]]) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.JoinedStr):
        head = node.values[0] if node.values else None
        return {head.value} if isinstance(head, ast.Constant) else set()
    if isinstance(node, ast.Name):
        return bound.get(node.id, set())
    return set()


def _names_fusecut(node: ast.AST | None, bound: dict[str, set[str]]) -> bool:
    return node is not None and any(
        s.startswith("FUSECUT_") for n in ast.walk(node) for s in _strings(n, bound))


def environment_reads(source: str) -> list[int]:
    """The lines where a module reads (or sets) a FUSECUT_* variable itself: os.environ's
    item, get, pop or setdefault, os.getenv or ``in os.environ`` with a FUSECUT_* key (a string,
    or a name bound to one); os.environ iterated where a FUSECUT_* string picks its names; a
    CLI option's ``envvar="FUSECUT_..."`` (typer reads it). By name, not by data flow."""
    tree = ast.parse(source)
    bound = _bound_strings(tree)
    found = set()
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and _environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args and (
                _environ(node.func) or (isinstance(node.func, ast.Attribute)
                                        and node.func.attr in KEYED and _environ(node.func.value))):
            key = node.args[0]
        elif isinstance(node, ast.Compare) and any(_environ(c) for c in node.comparators):
            key = node.left
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and \
                any(_environ(n) for g in node.generators for n in ast.walk(g.iter)):
            key = node
        elif isinstance(node, ast.Call):
            key = next((k.value for k in node.keywords if k.arg == "envvar"), None)
        if _names_fusecut(key, bound):
            found.add(node.lineno)
    return sorted(found)


def test_no_module_but_the_environment_reads_a_fusecut_variable_itself():
    modules = [p for p in rooms.source_files() if p != SRC / "environment.py"]
    assert len(modules) > 100
    readers = {rooms.module_name(p): lines for p in modules
               if (lines := environment_reads(p.read_text()))}
    assert not readers, f"read FUSECUT_* through fusecut.environment, not os.environ: {readers}"


@pytest.mark.parametrize("source", [
    'import os\nON = os.environ.get("FUSECUT_NATIVE", "1") not in ("0", "false", "no")\n',
    'import os\nENV = "FUSECUT_COMPILE_AHEAD"\ndef on():\n    return os.environ.get(ENV) != "0"\n',
    'import os\nfor f in fields:\n    name = f"FUSECUT_{f.name.upper()}"\n'
    '    raw = os.environ.get(name)\n',
    'import os\nenv = {k: v for k, v in os.environ.items() if k.startswith("FUSECUT_")}\n',
    'import os\nfor name, value in (("FUSECUT_DB_PATH", db), ("FUSECUT_GPUS", gpus)):\n'
    '    os.environ[name] = value\n',
    'import typer\ngpus = typer.Option(None, "--gpus", envvar="FUSECUT_GPUS")\n',
    'from os import environ, getenv\na = environ["FUSECUT_WORKER"]\nb = getenv("FUSECUT_X")\n',
    'import os\nif "FUSECUT_NATIVE" in os.environ:\n    pass\n',
])
def test_the_check_sees_a_module_reading_one(source):
    assert environment_reads(source), source


def test_the_check_leaves_other_variables_alone():
    source = ('import os\ndef serve():\n    cxx = os.environ.get("CXX")\n'
              '    env = dict(os.environ)\n    os.environ.update(settings)\n'
              '    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):\n'
              '        print("set FUSECUT_ALLOWED_HOSTS")\n')
    assert environment_reads(source) == []


# ---- fusecut serve -------------------------------------------------------------------------------

def serve(args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FUSECUT_")}
    return subprocess.run([sys.executable, "-m", "fusecut.cli", "serve", "--port", "9", *args],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_serve_names_where_a_bad_gpu_list_came_from():
    r = serve([], FUSECUT_GPUS="0,x")
    assert r.returncode == 2 and r.stderr.startswith(
        "error: FUSECUT_GPUS takes 'all' or device indices like 0,1; got 'x'"), r.stderr
    r = serve(["--gpus", "0,x"], FUSECUT_GPUS="0")
    assert r.returncode == 2 and r.stderr.startswith(
        "error: --gpus takes 'all' or device indices like 0,1; got 'x'"), r.stderr


def test_serve_checks_every_variable_at_start():
    r = serve([], FUSECUT_NATIVE="nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: FUSECUT_NATIVE must be one of 1, true, yes, on"), r.stderr


def test_a_misspelt_variable_is_named_with_the_setting_it_is_closest_to(monkeypatch):
    for name in [n for n in os.environ if n.startswith("FUSECUT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FUSECUT_WORKERS", "off")  # FUSECUT_WORKER meant: it changed nothing
    monkeypatch.setenv("FUSECUT_NOTHING_LIKE_IT", "1")
    monkeypatch.setenv("FUSECUT_NATIVE", "0")  # declared: not named
    assert environment.unknown() == [
        "FUSECUT_NOTHING_LIKE_IT is not a fusecut setting: it changes nothing",
        "FUSECUT_WORKERS is not a fusecut setting (did you mean FUSECUT_WORKER?): it changes "
        "nothing"]


def test_serve_says_a_misspelt_variable_first():
    r = serve([], FUSECUT_WORKERS="off", FUSECUT_NATIVE="nope")  # then stops on the bad one
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("warning: FUSECUT_WORKERS is not a fusecut setting (did you "
                               "mean FUSECUT_WORKER?)"), r.stderr
    assert any(line.startswith("error: FUSECUT_NATIVE must be one of") for line in lines)
