"""A plan cache's password is never shown (issue 45): /readyz (unauthenticated, even with an
API key set) and the log name the cache by its location with every password form libpq accepts
replaced: the URL's user info, a ``password=`` (or ``sslpassword=``) query parameter, and the
``key=value`` connection string form."""

from __future__ import annotations

import httpx
import pytest

from fusecut.service.cache.store import PlanStore, redact
from tests.server import Server, free_port

SECRET = "S3cretValue"


@pytest.mark.parametrize("location, shown", [
    (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
    (f"postgres://u:{SECRET}@h:5432,h2:5433/db?sslmode=require",
     "postgres://u:***@h:5432,h2:5433/db?sslmode=require"),
    (f"postgresql://u@h/db?password={SECRET}", "postgresql://u@h/db?password=***"),
    (f"postgresql://u@h/db?sslmode=disable&password={SECRET}&application_name=x",
     "postgresql://u@h/db?sslmode=disable&password=***&application_name=x"),
    (f"postgresql://u@h/db?sslpassword={SECRET}", "postgresql://u@h/db?sslpassword=***"),
    (f"postgresql://u@h/db?PASSWORD={SECRET}", "postgresql://u@h/db?PASSWORD=***"),
    (f"postgresql://u:{SECRET}@h/db?password={SECRET}", "postgresql://u:***@h/db?password=***"),
    (f"host=h password={SECRET} dbname=x", "host=h password=*** dbname=x"),
    (f"host=h password = '{SECRET} x' dbname=x", "host=h password = *** dbname=x"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("/var/lib/fusecut/plans.sqlite", "/var/lib/fusecut/plans.sqlite"),
])
def test_every_password_form_is_redacted(location, shown):
    assert redact(location) == shown
    assert SECRET not in redact(location)


def test_an_error_naming_the_password_is_redacted_too(caplog):
    # a URL libpq cannot parse: its message may quote the connection string
    store = PlanStore(f"postgresql://u@127.0.0.1:{free_port()}/db?password={SECRET}&bad%zz=1",
                      retry_s=30)
    assert store.get("a" * 32) is None
    status = store.status()
    store.close()
    assert status["state"] == "degraded"
    assert SECRET not in str(status) and SECRET not in caplog.text
    assert "password=***" in status["location"]


def test_readyz_and_the_log_never_show_the_password(tmp_path):
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/db?password={SECRET}"  # no server
    with Server(tmp_path / "plans.sqlite", cache_url=url, api_key="k" * 32) as server:
        ready = httpx.get(f"{server.url}/readyz", timeout=30)
        made = httpx.post(f"{server.url}/v1/plan", timeout=60,
                          headers={"authorization": f"Bearer {'k' * 32}"},
                          json={"definition": "def fusion(fd):\n"
                                "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], "
                                "dtype=DataType.Float)\n"
                                "    fd.add_output(fd.ops.neg(T0))\n",
                                "inputs": [{"shape": [4], "dtype": "float32"}]})
        assert made.status_code == 200, made.text
        ready = httpx.get(f"{server.url}/readyz", timeout=30)
    assert ready.status_code == 200
    cache = ready.json()["cache"]
    assert cache["state"] == "degraded" and cache["location"].endswith("password=***")
    assert SECRET not in ready.text
    log = server.log.read_text()
    assert "plan cache" in log and SECRET not in log
