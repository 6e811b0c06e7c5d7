"""Every FUSECUT_* setting is checked at start (issue 45): a bad value is one line naming the
variable, from Settings and from ``fusecut serve`` (exit 2, no traceback), instead of a service
that starts and then drops bodies (FUSECUT_MIN_BODY_RATE=0), answers 500s
(FUSECUT_QUEUE_WAIT_S=nan, FUSECUT_CACHE_MEMORY_ITEMS=-1), never answers
(FUSECUT_READ_TIMEOUT_S=nan) or turns workers on (FUSECUT_WORKER=off). One rule for booleans."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fusecut.service.settings import FALSE, TRUE, SettingError, Settings

BAD = [
    ("FUSECUT_MIN_BODY_RATE", "0"), ("FUSECUT_MIN_BODY_RATE", "-5"),
    ("FUSECUT_QUEUE_WAIT_S", "nan"), ("FUSECUT_QUEUE_WAIT_S", "0"),
    ("FUSECUT_READ_TIMEOUT_S", "nan"), ("FUSECUT_READ_TIMEOUT_S", "inf"),
    ("FUSECUT_HEADER_TIMEOUT_S", "-1"), ("FUSECUT_EXECUTE_TIMEOUT_S", "0"),
    ("FUSECUT_PLAN_GRACE_S", "-1"), ("FUSECUT_CACHE_TIMEOUT_S", "0"),
    ("FUSECUT_CACHE_MEMORY_ITEMS", "-1"), ("FUSECUT_CACHE_MAX_BYTES", "0"),
    ("FUSECUT_WORKERS_PER_DEVICE", "0"), ("FUSECUT_MAX_CONCURRENT_PLANS", "0"),
    ("FUSECUT_MAX_QUEUED_PLANS", "-1"), ("FUSECUT_MAX_CONNECTIONS", "0"),
    ("FUSECUT_MAX_HEADER_COUNT", "0"), ("FUSECUT_MAX_BODY_BYTES", "-1"),
    ("FUSECUT_MAX_OPS", "many"), ("FUSECUT_RECENT_PLANS", "1.5"),
    ("FUSECUT_WORKER", "maybe"), ("FUSECUT_METRICS_NEED_KEY", "2"),
    ("FUSECUT_API_KEY", "   "), ("FUSECUT_CACHE_URL", "mysql://u:pw@h/db"),
]


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("FUSECUT_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("name, value", BAD)
def test_a_bad_value_is_one_line_naming_its_variable(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(SettingError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert message.startswith(name) and "\n" not in message, message
    assert "pw" not in message  # a cache URL's password is not repeated


@pytest.mark.parametrize("name", ["FUSECUT_WORKER", "FUSECUT_METRICS_NEED_KEY"])
def test_one_rule_for_booleans(clean_env, name):
    field = name.removeprefix("FUSECUT_").lower()
    for spelling in FALSE + tuple(s.upper() for s in FALSE) + (" off ",):
        clean_env.setenv(name, spelling)
        assert getattr(Settings.from_env(), field) is False, spelling
    for spelling in TRUE + tuple(s.upper() for s in TRUE):
        clean_env.setenv(name, spelling)
        assert getattr(Settings.from_env(), field) is True, spelling
    clean_env.setenv(name, "")  # set empty: the default
    assert getattr(Settings.from_env(), field) == getattr(Settings(), field)


def test_worker_off_means_off(clean_env):
    clean_env.setenv("FUSECUT_WORKER", "off")
    assert Settings.from_env().worker is False


def test_good_values_still_pass(clean_env):
    for name, value in [("FUSECUT_CACHE_MEMORY_ITEMS", "0"), ("FUSECUT_PLAN_GRACE_S", "0"),
                        ("FUSECUT_MAX_QUEUED_EXECUTIONS", "0"), ("FUSECUT_QUEUE_WAIT_S", "0.5"),
                        ("FUSECUT_CACHE_URL", "postgresql://u@h/db"),
                        ("FUSECUT_MAX_REQUESTS_PER_CLIENT", "0")]:
        clean_env.setenv(name, value)
    s = Settings.from_env()
    assert s.cache_memory_items == 0 and s.queue_wait_s == 0.5


def test_direct_construction_is_checked_too():
    with pytest.raises(SettingError, match="^FUSECUT_MIN_BODY_RATE must be"):
        Settings(db_path=":memory:", min_body_rate=0)


@pytest.mark.parametrize("name, value", [("FUSECUT_MIN_BODY_RATE", "0"),
                                         ("FUSECUT_READ_TIMEOUT_S", "nan"),
                                         ("FUSECUT_WORKER", "maybe")])
def test_serve_refuses_a_bad_setting_in_one_line(name, value):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSECUT_")}
    env[name] = value
    r = subprocess.run([sys.executable, "-m", "fusecut.cli", "serve", "--port", "9"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {name} "), r.stderr


def test_ray_serve_refuses_a_bad_setting_and_port_before_starting_ray():
    pytest.importorskip("ray.serve", reason="the ray extra")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSECUT_")}
    for args, extra, said in ((["--port", "83748"], {}, "--port"),
                              ([], {"FUSECUT_WORKER": "maybe"}, "error: FUSECUT_WORKER ")):
        r = subprocess.run([sys.executable, "-m", "fusecut.cli", "ray-serve", *args],
                           env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_postgresql_cache_without_its_driver_says_what_to_install(clean_env, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "psycopg_pool" else real(name, *a))
    clean_env.setenv("FUSECUT_CACHE_URL", "postgresql://u@h/db")
    with pytest.raises(SettingError, match=r"^FUSECUT_CACHE_URL names PostgreSQL.*"
                                           r"pip install 'fusecut\[postgres\]'"):
        Settings.from_env()
