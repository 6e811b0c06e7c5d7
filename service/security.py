"""Who may call the service, and what browsers are told.

- ``key_matches``: the API key, compared in constant time (a byte-by-byte comparison answers
  sooner for a wrong first byte, which leaks the key to a patient client).
- ``AllowedHosts``: the service answers only requests naming it, in ``Host``, by a loopback name
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port) or one ``FUSECUT_ALLOWED_HOSTS`` lists
  (``*``: any). A page of another site can have its own name resolve to 127.0.0.1 (DNS
  rebinding): its requests are then same-origin to the browser, which sends no ``Origin`` on a
  GET and the page's own name in ``Host``; only the Host tells them apart (issue 32: ``Origin:
  http://attacker.example`` with ``Host: attacker.example:P`` got 200). Refused with 403.
- ``CrossOrigin``: a web page on another origin cannot use the service through its visitors'
  browsers. A browser names the page's origin in ``Origin`` on every cross-origin request (and a
  ``multipart/form-data`` POST needs no preflight, so CORS alone would not stop it from
  running); such a request is refused with 403 unless ``FUSECUT_CORS_ORIGINS`` lists the origin.
  Same-origin requests (the /docs page: its origin is an allowed host's) and clients that are
  not browsers (no ``Origin``) pass.
- ``SecurityHeaders``: ``X-Content-Type-Options``, ``X-Frame-Options`` on every response, and a
  Content-Security-Policy on HTML pages (the dashboard runs no script and loads nothing).
"""

from __future__ import annotations

import hmac

from fusecut.service.problems import problem_response

# HTML pages: inline styles and SVG only; /docs sets its own (Swagger UI's script and assets)
PAGE_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
DOCS_POLICY = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' "
               "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def key_matches(authorization: str, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (constant time)."""
    return hmac.compare_digest(authorization.encode(), f"Bearer {key}".encode())


def allowed_origins(setting: str) -> list[str]:
    return [o.strip().rstrip("/") for o in setting.split(",") if o.strip()]


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(setting: str) -> set[str] | None:
    """The host names (no ports) requests may name: loopback ones and those listed; None for
    any (``*``)."""
    listed = {h.strip().lower().strip("[]") for h in setting.split(",") if h.strip()}
    return None if "*" in listed else listed | set(LOOPBACK_HOSTS)


def host_name(host: str) -> str:
    """The name in a ``Host`` header value: its port dropped, an IPv6 address unbracketed."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


class AllowedHosts:
    """Pure ASGI middleware: refuse requests whose ``Host`` names the service by a name it
    does not answer to (a page that rebinds its own name to this address)."""

    def __init__(self, app, allowed: set[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.allowed is None:
            return await self.app(scope, receive, send)
        host = dict(scope.get("headers") or []).get(b"host")
        if host is not None and host_name(host.decode("latin-1")) not in self.allowed:
            shown = host.decode("latin-1")[:100]
            listed = ", ".join(sorted(self.allowed))
            response = problem_response(
                403, "host not allowed",
                f"this service answers requests for {listed}, not {shown!r} (a page of another "
                f"site whose name resolves here); its operator can add the name with "
                f"FUSECUT_ALLOWED_HOSTS", scope.get("path"))
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class CrossOrigin:
    """Pure ASGI middleware: refuse requests from browser pages of origins not allowed."""

    def __init__(self, app, allowed: list[str]):
        self.app, self.allowed = app, set(allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin", b"").decode("latin-1").rstrip("/")
        if origin and origin not in self.allowed:
            own = f"{scope.get('scheme', 'http')}://{headers.get(b'host', b'').decode('latin-1')}"
            if origin != own:
                response = problem_response(
                    403, "cross-origin request refused",
                    f"requests from pages of {origin[:100]} are not allowed; the service's "
                    f"operator can allow the origin with FUSECUT_CORS_ORIGINS", scope.get("path"))
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class SecurityHeaders:
    """Pure ASGI middleware: the headers every response carries, and a CSP on HTML."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                names = {name.lower() for name, _ in headers}
                headers += [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY")]
                content_type = dict(headers).get(b"content-type", b"")
                if content_type.startswith(b"text/html") and \
                        b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", PAGE_POLICY.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
