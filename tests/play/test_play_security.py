"""Who may reach a served world: Host, Origin and token rules, through the real ASGI app (starlette TestClient)
and, for the token, the real command on a non-loopback bind."""

from __future__ import annotations

import pytest
from starlette.websockets import WebSocketDisconnect

from solarwm.play.access import access_for
from solarwm.play.server import WorldServer

from commands import solarwm_argv
from play_worlds import client, connect, read_block, tiny_spec


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    return tiny_spec(tmp_path_factory.mktemp("security"))


def refused(server, base_url: str, headers: dict[str, str], path: str = "/ws") -> bool:
    """Whether the WebSocket upgrade is refused before the world starts."""
    with client(server, base_url) as c:
        try:
            with connect(c, path, headers) as ws:
                read_block(ws)
                return False
        except WebSocketDisconnect as e:
            assert e.code == 1008
            return True


def test_only_the_pages_own_origin_opens_the_world(spec):
    server = WorldServer(spec)
    # A page on another site, and a DNS-rebinding page (its own name resolved to 127.0.0.1): refused.
    assert refused(server, "http://127.0.0.1:7860", {"origin": "https://evil.example"})
    assert refused(server, "http://evil.example:7860", {"origin": "http://evil.example:7860"})
    assert refused(server, "http://evil.example:7860", {})  # Host alone is checked too
    assert refused(server, "http://127.0.0.1:7860", {"origin": "null"})
    # The page itself, under each loopback name, and a client that is not a browser page (no Origin).
    assert not refused(server, "http://127.0.0.1:7860", {"origin": "http://127.0.0.1:7860"})
    assert not refused(server, "http://localhost:7860", {"origin": "http://localhost:7860"})
    assert not refused(server, "http://127.0.0.1:7860", {})


def test_allow_origin_admits_exactly_the_named_origin(spec):
    server = WorldServer(spec, access=access_for("127.0.0.1", ["https://Lab.Example/"]))
    assert not refused(server, "http://127.0.0.1:7860", {"origin": "https://lab.example"})
    assert refused(server, "http://127.0.0.1:7860", {"origin": "https://lab.example.evil.example"})
    assert refused(server, "http://127.0.0.1:7860", {"origin": "http://lab.example"})  # another scheme


def test_http_routes_check_host_and_the_api_pages_are_off(spec):
    server = WorldServer(spec)
    with client(server, "http://evil.example:7860") as c:
        assert c.get("/").status_code == 403 and c.get("/config.json").status_code == 403
    with client(server) as c:
        assert c.get("/").status_code == 200 and c.get("/config.json").json()["fps"] == 16.0
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert c.get(path).status_code == 404, path


def test_a_non_loopback_bind_needs_the_random_token(spec):
    access = access_for("0.0.0.0")
    assert access.token is not None and len(access.token) >= 32
    assert access_for("0.0.0.0").token != access.token  # fresh each time
    assert access_for("127.0.0.1").token is None
    server = WorldServer(spec, access=access)
    with client(server, "http://10.1.2.3:7860") as c:
        assert c.get("/config.json").status_code == 403
        assert c.get("/config.json?token=wrong").status_code == 403
        assert c.get(f"/config.json?token={access.token}").status_code == 200
    assert refused(server, "http://10.1.2.3:7860", {}, "/ws?token=wrong")
    assert not refused(server, "http://10.1.2.3:7860", {"origin": "http://10.1.2.3:7860"}, f"/ws?token={access.token}")


@pytest.mark.slow
def test_the_command_on_a_public_bind_warns_and_prints_the_token_url(spec, tmp_path):
    import re
    import subprocess
    import time
    import urllib.error
    import urllib.request

    from play_fixtures import free_port

    port = free_port()
    log = tmp_path / "play.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [*solarwm_argv(), "play", "--host", "0.0.0.0", "--port", str(port),
             "--adapter", spec.model["adapter"], "--first_frame", spec.model["adapter"] + "/../first.png"],
            stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while "Ctrl-C" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
            text = log.read_text()
            assert "WARNING" in text and "exposed" in text, text
            token = re.search(r"\?token=([A-Za-z0-9_-]+)", text).group(1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/config.json?token={token}", timeout=30) as r:
                assert r.status == 200
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/config.json", timeout=30)
            assert e.value.code == 403
        finally:
            process.terminate()
            process.wait(60)
    assert token not in "".join(p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file() and p != log)


@pytest.mark.slow
def test_a_plain_upgrade_from_a_foreign_origin_gets_403_from_the_real_server(spec):
    import socket

    from play_fixtures import PlayServer

    server = PlayServer(["--adapter", spec.model["adapter"], "--first_frame", spec.model["adapter"] + "/../first.png"])
    try:
        def upgrade(origin: str) -> str:
            with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
                s.sendall((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           f"Sec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n\r\n").encode())
                return s.recv(4096).decode("latin-1").splitlines()[0]

        assert " 403 " in upgrade("https://evil.example") + " "
        assert " 101 " in upgrade(f"http://127.0.0.1:{server.port}") + " "
    finally:
        server.stop()

