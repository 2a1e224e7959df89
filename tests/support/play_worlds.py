"""In-process `solarwm play` worlds for the tests: a ``WorldSpec`` of the tiny adapter, a TestClient, block reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from play_fixtures import first_frame_png, tiny_causal_adapter

#: The base URL the TestClient's requests name (Host and the page's own origin).
BASE = "http://127.0.0.1:7860"


def tiny_spec(root: Path, **settings: Any) -> Any:
    """``build_spec`` of a tiny random-weight causal adapter and a 32x32 first frame exported under ``root``
    (made once per root); ``settings`` override the flags (caption "a hallway", seed 4, num_steps 2)."""
    from solarwm.play.cli import build_spec

    adapter = root / "adapter"
    if not (adapter / "adapter.json").is_file():
        tiny_causal_adapter(adapter)
    png = root / "first.png"
    if not png.is_file():
        first_frame_png(png)
    flags = {"caption": "a hallway", "seed": 4, "num_steps": 2, **settings}
    return build_spec(adapter=str(adapter), first_frame=str(png), **flags)


def client(server: Any, base_url: str = BASE) -> Any:
    """A starlette TestClient of ``server.app`` (the access rules included) whose requests name ``base_url``."""
    from starlette.testclient import TestClient

    return TestClient(server.app, base_url=base_url)


def connect(c: Any, path: str = "/ws", headers: dict[str, str] | None = None) -> Any:
    """``c.websocket_connect(path)`` naming the client's base URL in ``Host`` (the TestClient's WebSocket would
    say ``testserver``)."""
    from urllib.parse import urlsplit

    return c.websocket_connect(path, headers={"host": urlsplit(str(c.base_url)).netloc, **(headers or {})})


def read_block(ws: Any) -> tuple[list[bytes], dict, list[dict]]:
    """Read one block from a TestClient WebSocket: its JPEG frames, its block message and other texts before it."""
    frames: list[bytes] = []
    texts: list[dict] = []
    while True:
        message = ws.receive()
        if message["type"] == "websocket.close":
            raise AssertionError(f"the server closed the world: {message}")
        if message.get("bytes") is not None:
            frames.append(message["bytes"])
            continue
        text = json.loads(message["text"])
        if text["type"] == "block":
            return frames, text, texts
        texts.append(text)


def read_text(ws: Any, kind: str) -> dict:
    """The next text message of ``kind`` (``error``, ...), skipping frames and block reports."""
    while True:
        message = ws.receive()
        if message["type"] == "websocket.close":
            raise AssertionError(f"the server closed the world: {message}")
        if message.get("text") is not None and json.loads(message["text"])["type"] == kind:
            return json.loads(message["text"])
