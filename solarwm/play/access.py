"""Who may reach a served world: the ``Host``, ``Origin`` and token rules of ``solarwm play``.

A browser lets any page open a WebSocket to any address, and DNS rebinding gives a foreign name to 127.0.0.1,
so a loopback bind alone keeps nobody out. The rules (docs/play-protocol.md):

* ``Host`` must name the server: on a loopback bind one of ``LOOPBACK_NAMES``; on a bind to one address that
  address or a loopback name; on a wildcard bind (``0.0.0.0``, ``::``) any name, since the token guards it.
  The hosts of ``--allow_origin`` origins count too.
* A WebSocket ``Origin``, when the client sends one (browsers always do), must be the page's own origin
  (``http://<Host>``) or one given with ``--allow_origin``.
* A non-loopback bind needs a token: a random ``secrets.token_urlsafe`` value, printed in the URL as
  ``?token=...`` and never written to disk; every request carries it in its query string.

A refused HTTP request gets ``403``; a refused WebSocket is closed before it is accepted (``403`` on the wire).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

#: The names of this machine on a loopback bind.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: Random bytes of a token (``secrets.token_urlsafe`` prints about 1.3 characters per byte).
TOKEN_BYTES = 24
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalise_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, as browsers send ``Origin``; raises ``ValueError`` for anything else."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"--allow_origin {origin!r}: give an origin such as https://example.org or http://host:8000")
    return f"{parts.scheme}://{parts.netloc.lower()}"


def _hostname(netloc: str) -> str | None:
    """The host name of a ``Host`` header or an origin's netloc (no port, no brackets), or None if malformed."""
    try:
        name = urlsplit("//" + netloc).hostname
    except ValueError:
        return None
    return name.lower() if name else None


@dataclass(frozen=True)
class Access:
    """The access rules of one server (see the module docstring)."""

    hosts: frozenset[str] | None  # host names a request may name in Host; None: any (a wildcard bind)
    origins: frozenset[str] = field(default_factory=frozenset)  # --allow_origin, normalised
    token: str | None = None

    def host_allowed(self, host_header: str | None) -> bool:
        """Whether a request's ``Host`` names this server."""
        name = _hostname(host_header or "")
        if name is None:
            return False
        return self.hosts is None or name in self.hosts

    def origin_allowed(self, origin: str | None, host_header: str | None) -> bool:
        """Whether a WebSocket from a page of ``origin`` may connect (no ``Origin``: not a browser page)."""
        if origin is None:
            return True
        origin = origin.strip().lower()
        same = f"http://{(host_header or '').lower()}", f"https://{(host_header or '').lower()}"
        return origin in same or origin in self.origins

    def token_allowed(self, query_string: bytes) -> bool:
        """Whether the query string carries the token (always, when the server has none)."""
        if self.token is None:
            return True
        given = parse_qs(query_string.decode("latin-1")).get("token", [""])[-1]
        return hmac.compare_digest(given.encode(), self.token.encode())

    def refusal(self, scope: dict[str, Any]) -> str | None:
        """Why the request of ``scope`` is refused, or None when it may go on."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not self.host_allowed(headers.get("host")):
            return f"Host {headers.get('host')!r} does not name this server"
        if scope["type"] == "websocket" and not self.origin_allowed(headers.get("origin"), headers.get("host")):
            return f"Origin {headers.get('origin')!r} is not this page's (see --allow_origin)"
        if not self.token_allowed(scope.get("query_string", b"")):
            return "missing or wrong token (open the URL the server printed)"
        return None


def access_for(host: str, allow_origin: list[str] | None = None, token: str | None = None) -> Access:
    """The rules of a server bound to ``host``: a non-loopback bind gets a fresh token unless one is given."""
    origins = frozenset(normalise_origin(o) for o in allow_origin or [])
    extra = {n for n in (_hostname(urlsplit(o).netloc) for o in origins) if n}
    if host in WILDCARD_HOSTS:
        hosts = None
    else:
        hosts = frozenset({host.strip("[]").lower(), *LOOPBACK_NAMES, *extra})
    if not is_loopback(host) and token is None:
        token = secrets.token_urlsafe(TOKEN_BYTES)
    return Access(hosts, origins, token)


def guard(app: Callable, access: Access) -> Callable:
    """The ASGI ``app`` behind ``access``: refused HTTP requests get 403, refused WebSockets are never accepted."""

    async def guarded(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] in ("http", "websocket"):
            why = access.refusal(scope)
            if why is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})
                else:
                    body = f"forbidden: {why}\n".encode()
                    await send({"type": "http.response.start", "status": 403,
                                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded
