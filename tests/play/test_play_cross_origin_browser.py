"""A page of another origin in headless Chromium cannot open a served world; the server's own page can."""

from __future__ import annotations

import http.server
import shutil
import threading

import pytest

from play_fixtures import PlayServer, first_frame_png, tiny_causal_adapter

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_MS = 300_000
PROBE = """<!doctype html><script>
window.result = "pending";
const ws = new WebSocket("ws://127.0.0.1:%d/ws");
ws.onmessage = () => { window.result = "received"; ws.close(); };
ws.onclose = () => { if (window.result === "pending") window.result = "closed"; };
ws.onerror = () => { if (window.result === "pending") window.result = "refused"; };
</script>"""


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_a_page_on_another_origin_cannot_open_the_world(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")

    server = PlayServer(["--adapter", str(tiny_causal_adapter(tmp_path / "adapter")),
                         "--first_frame", str(first_frame_png(tmp_path / "first.png")), "--num_steps", "1"])
    page_html = (PROBE % server.port).encode()

    class Foreign(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page_html)

        def log_message(self, *args) -> None:
            pass

    foreign = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Foreign)  # another port: another origin
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{foreign.server_address[1]}/")
            page.wait_for_function("window.result !== 'pending'", timeout=TIMEOUT_MS)
            foreign_result = page.evaluate("window.result")
            own = browser.new_page()
            own.goto(server.url + "/")
            own.wait_for_function("window.solarwm.framesReceived > 0", timeout=TIMEOUT_MS)
            browser.close()
    finally:
        foreign.shutdown()
        server.stop()
    assert foreign_result in ("refused", "closed"), foreign_result
