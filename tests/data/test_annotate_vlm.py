"""The Table 2 captioner against a local HTTP server speaking the chat-completions protocol."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from solarwm.data.annotate import vlm
from solarwm.data.annotate.runner import annotate_clip
from solarwm.data.annotate.stages import AnnotateConfig
from solarwm.data.contract import iter_clip_dirs, read_meta

API_KEY = "sk-test-secret-0123456789"
CAPTION = " ".join(
    ["A quiet courtyard of pale stone walls, low hedges and a shallow pool under soft overcast light."] * 5
)


def answer(**override: Any) -> dict[str, Any]:
    obj = {
        "dense_caption": CAPTION,
        "vlm_entity_density": 1,
        "vlm_quality": 4.0,
        "reject_flags": ["near_static"],
        "scene_type": "rendered",
        "scene_transition": {"label": "none", "count": 0, "timestamps_sec": [], "evidence": "one continuous place"},
    }
    obj.update(override)
    return obj


class FakeChat:
    """A chat-completions endpoint replying with queued contents and recording every request."""

    def __init__(self, replies: list[str]):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if self.path != "/v1/chat/completions":
                    self.send_error(404)
                    return
                content = outer.replies.pop(0) if len(outer.replies) > 1 else outer.replies[0]
                payload = json.dumps(
                    {
                        "id": f"chatcmpl-{len(outer.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeChat":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def corpus_src(render_corpus) -> Path:
    return render_corpus(clips=1, frames=17, width=48, height=32, fps=8.0, seed=5)  # 2.125 s -> 3 frames at 1 fps


@pytest.fixture
def clip(corpus_src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import shutil

    shutil.copytree(corpus_src, tmp_path / "corpus")
    monkeypatch.setenv("SOLARWM_VLM_API_KEY", API_KEY)
    yield iter_clip_dirs(tmp_path / "corpus")[0]


def run(clip: Path, server: FakeChat) -> Any:
    config = AnnotateConfig(vlm_endpoint=server.endpoint, vlm_model="kimi-k2.6")
    return annotate_clip(str(clip), ["vlm"], config)


def no_file_contains_key(root: Path) -> bool:
    return all(API_KEY.encode() not in p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_valid_answer_is_stored(clip: Path) -> None:
    with FakeChat([json.dumps(answer())]) as server:
        result = run(clip, server)
    assert result.stages == {"vlm": "ok"}
    meta = read_meta(clip)
    assert meta["caption"] == CAPTION
    assert (clip / "prompt.txt").read_text() == CAPTION + "\n"
    m = meta["metrics"]
    assert m["metrics.vlm_entity_density"] == 1 and m["metrics.vlm_quality"] == 4.0
    assert m["metrics.vlm_reject_flags"] == ["near_static"] and m["metrics.vlm_scene_type"] == "rendered"
    assert m["metrics.vlm_transition_label"] == "none" and m["metrics.vlm_transition_count"] == 0

    (req,) = server.requests
    body = req["body"]
    assert body["model"] == "kimi-k2.6" and body["temperature"] == 0 and body["seed"] == 0
    assert req["headers"]["Authorization"] == f"Bearer {API_KEY}"
    images = [c["image_url"]["url"] for c in body["messages"][1]["content"] if c["type"] == "image_url"]
    assert len(images) == 3  # ceil(17 / 8 fps)
    assert all(u.startswith("data:image/jpeg;base64,") for u in images)
    assert base64.b64decode(images[0].split(",", 1)[1])[:2] == b"\xff\xd8"  # a JPEG
    assert no_file_contains_key(clip.parent)


def test_invalid_then_valid_retries_with_error(clip: Path) -> None:
    bad = json.dumps(answer(vlm_entity_density=7))
    with FakeChat([bad, json.dumps(answer())]) as server:
        result = run(clip, server)
    assert result.stages == {"vlm": "ok"}
    assert len(server.requests) == 2
    follow_up = server.requests[1]["body"]["messages"]
    assert follow_up[-2] == {"role": "assistant", "content": bad}
    assert "vlm_entity_density" in follow_up[-1]["content"]
    assert read_meta(clip)["caption"] == CAPTION


def test_always_invalid_records_failure_and_stores_nothing(clip: Path) -> None:
    before = read_meta(clip)
    prompt_before = (clip / "prompt.txt").read_text()
    with FakeChat(["```json\n{}\n```"]) as server:
        result = run(clip, server)
    assert result.stages == {"vlm": "failed"}
    assert len(server.requests) == 3  # first try + 2 retries
    meta = read_meta(clip)
    rec = meta["provenance"]["stages"]["vlm"]
    assert rec["status"] == "failed" and "no valid reply after 3 attempts" in rec["error"]
    assert meta["metrics"] == before["metrics"] and meta["caption"] == before["caption"]
    assert (clip / "prompt.txt").read_text() == prompt_before
    assert no_file_contains_key(clip.parent)


@pytest.mark.parametrize(
    "override, match",
    [
        ({"dense_caption": "Too short."}, "words"),
        ({"vlm_entity_density": True}, "vlm_entity_density"),
        ({"vlm_quality": 3.5}, "vlm_quality"),
        ({"reject_flags": ["blurry", "blurry"]}, "duplicates"),
        ({"reject_flags": ["people"]}, "unknown flags"),
        ({"scene_type": "cartoon"}, "scene_type"),
        (
            {"scene_transition": {"label": "definite", "count": 2, "timestamps_sec": [1.0], "evidence": "cut"}},
            "count is 2",
        ),
        ({"scene_transition": {"label": "none", "count": 0, "timestamps_sec": []}}, "exactly the keys"),
        ({"extra": 1}, "unexpected"),
    ],
)
def test_validation_rejects(override: dict, match: str) -> None:
    with pytest.raises(vlm.VLMResponseError, match=match):
        vlm.validate_response(json.dumps(answer(**override)))


def test_validation_accepts_integral_quality_and_transitions() -> None:
    obj = vlm.validate_response(
        json.dumps(
            answer(
                vlm_quality=5,
                scene_transition={
                    "label": "definite",
                    "count": 1,
                    "timestamps_sec": [1.5],
                    "evidence": "cut to a street",
                },
            )
        )
    )
    _, metrics = vlm.to_record(obj)
    assert metrics["metrics.vlm_quality"] == 5.0 and metrics["metrics.vlm_transition_count"] == 1


def test_frame_sampling_and_encoding() -> None:
    assert vlm.sample_indices(16, 16.0) == [0]
    assert vlm.sample_indices(17, 8.0) == [0, 8, 16]
    long = vlm.sample_indices(30 * 100, 30.0)  # 100 s -> capped at 64 frames over the whole clip
    assert len(long) == 64 and long[0] == 0 and long[-1] > 30 * 95
    url = vlm.encode_frame(np.zeros((500, 1000, 3), np.uint8))
    import cv2

    img = cv2.imdecode(np.frombuffer(base64.b64decode(url.split(",", 1)[1]), np.uint8), cv2.IMREAD_COLOR)
    assert max(img.shape[:2]) == 768
