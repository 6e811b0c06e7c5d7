"""An error fusecut did not expect (a bug) is a problem+json 500 naming a request id, its text
kept in the log only, on a connection that stays open. The app runs in uvicorn in a thread, with
one route added that fails the way a bug would.

From the hostile-input reviews: issue 12 (defect 4) and issue 19 (defect 11).
"""

from __future__ import annotations

import json
import logging
from http.client import HTTPConnection

from fusecut.service.app import create_app
from fusecut.service.settings import Settings
from tests.server import ThreadServer


def test_an_unexpected_error_is_a_problem_500_with_a_request_id(tmp_path, caplog):
    app = create_app(Settings(db_path=str(tmp_path / "p.sqlite"), worker=False))

    @app.get("/boom")
    async def boom():
        raise ZeroDivisionError("a bug near b'\\x00secret'")

    with ThreadServer(app) as s, caplog.at_level(logging.ERROR, "fusecut.service"):
        conn = HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("GET", "/boom")
        response = conn.getresponse()
        body = json.loads(response.read())
        assert response.status == 500
        assert response.getheader("content-type").startswith("application/problem+json")
        request_id = response.getheader("x-request-id")
        assert request_id and body["request_id"] == request_id
        assert request_id in body["detail"] and "bug" in body["detail"]
        # issue 19, defect 11: the exception's text (internals, raw bytes) stays in the log
        assert "ZeroDivisionError" not in response_text(body) and "secret" not in \
            response_text(body)
        logged = [r for r in caplog.records if request_id in r.getMessage()]
        assert logged and "secret" in str(logged[0].exc_info[1])
        # the keep-alive connection was kept: the next request on it is answered
        conn.request("GET", "/healthz", headers={"x-request-id": "client-chosen.1"})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
        assert response.getheader("x-request-id") == "client-chosen.1"
        conn.close()


def response_text(body: dict) -> str:
    return json.dumps(body)
