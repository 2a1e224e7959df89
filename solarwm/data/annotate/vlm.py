"""The dense captioner of paper Table 2: an OpenAI-compatible chat-completions client with a strict JSON contract.

Frames are sampled at 1 fps (ffmpeg round-up: ``ceil(duration)`` frames, at most 64 spread over
the whole clip), resized to a longest edge <= 768 px, JPEG-encoded and sent as base64
``image_url`` data URLs with temperature 0 and seed 0. The reply must be one JSON object with
exactly the six Table 2 fields; an invalid reply is retried with the validation error fed back,
a bounded number of times, and otherwise the stage fails with nothing stored.

The API key is read only from the environment variable named by ``api_key_env`` and is sent
only in the ``Authorization`` header: it is never written to metadata, logs or errors.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_FRAMES = 64
MAX_EDGE = 768
# ffmpeg's mjpeg encoder at -q:v 3 quantises roughly like libjpeg quality ~90 (q:v 2 ~ 95, q:v 5 ~ 80);
# OpenCV exposes only the libjpeg quality, so 90 is our equivalent of "JPEG qscale 3".
JPEG_QUALITY = 90

REJECT_FLAGS = ("text_heavy", "watermark", "ui_overlay", "blurry", "near_static", "low_light", "nsfw", "single_color")
SCENE_TYPES = ("real_world", "rendered", "game", "animation", "mixed")
TRANSITION_LABELS = ("none", "possible", "definite")
FIELDS = ("dense_caption", "vlm_entity_density", "vlm_quality", "reject_flags", "scene_type", "scene_transition")
TRANSITION_FIELDS = ("label", "count", "timestamps_sec", "evidence")
CAPTION_WORDS = (60, 150)

PROMPT = f"""You annotate one video clip for training a camera-controlled world model. The images are frames of the \
ENTIRE clip sampled at 1 frame per second, in order. Inspect all of them.

Return ONLY one JSON object, with no Markdown, no code fences and no explanatory text, with exactly these six keys \
and no others:

"dense_caption": one English paragraph of {CAPTION_WORDS[0]} to {CAPTION_WORDS[1]} words describing only the \
persistent environment and stable scene content: architecture, terrain, vegetation, water, furniture, materials, \
lighting, weather, atmosphere and stable spatial relations. Do NOT mention people or animals, vehicles that move or \
may move, actions or events, camera motion, shot or viewpoint terms (e.g. close-up, aerial view, pan, frame), media \
terminology (e.g. video, clip, footage, image, scene cut), speculation, or any detail you cannot see.
"vlm_entity_density": integer 1, 2 or 3: the peak combined density of visible people, vehicles and animals in any \
frame (1 = none, 2 = sparse, 3 = dense).
"vlm_quality": one of 1.0, 2.0, 3.0, 4.0, 5.0: overall visual usability, from 1.0 = unusable to 5.0 = clean and \
richly describable.
"reject_flags": a list without duplicates of the flags that apply, chosen only from \
{json.dumps(list(REJECT_FLAGS))}; [] if none apply.
"scene_type": one of {json.dumps(list(SCENE_TYPES))}, classifying the visible world.
"scene_transition": an object with exactly the keys "label" (one of {json.dumps(list(TRANSITION_LABELS))}), "count" \
(integer number of transitions), "timestamps_sec" (list of numbers, one per transition, in seconds from the start of \
the clip; its length equals count) and "evidence" (short string). A transition is a cut, fade or switch to a \
different shot or place; continuous fast motion is NOT a transition.
"""


class VLMResponseError(ValueError):
    """The model's reply violates the Table 2 contract; the message says which field and why."""


@dataclass(frozen=True)
class VLMConfig:
    """Where and how to call the captioner; the API key itself is never part of the config."""

    endpoint: str  # base URL, e.g. http://host:8000/v1 ; we POST {endpoint}/chat/completions
    model: str
    api_key_env: str = "SOLARWM_VLM_API_KEY"
    max_retries: int = 2
    timeout_s: float = 300.0
    # Server-specific request fields, e.g. {"chat_template_kwargs": {"thinking": false}} for a
    # vLLM-served Kimi to honour Table 2's thinking=false; merged into the request body.
    extra_body: dict[str, Any] = field(default_factory=dict)


def sample_indices(num_frames: int, fps: float) -> list[int]:
    """1-fps frame indices with ffmpeg round-up (``ceil(duration)`` frames), at most 64 spread over the clip."""
    if num_frames <= 0 or not fps > 0:
        raise VLMResponseError(f"cannot sample frames: num_frames={num_frames}, fps={fps}")
    duration = num_frames / fps
    count = max(1, math.ceil(duration - 1e-9))
    step = 1.0 if count <= MAX_FRAMES else duration / MAX_FRAMES
    count = min(count, MAX_FRAMES)
    return sorted({min(math.ceil(k * step * fps - 1e-9), num_frames - 1) for k in range(count)})


def encode_frame(frame: np.ndarray) -> str:
    """RGB ``[H, W, 3]`` uint8 -> ``data:image/jpeg;base64,...`` with the longest edge <= 768 px."""
    import cv2

    h, w = frame.shape[:2]
    scale = MAX_EDGE / max(h, w)
    if scale < 1:
        frame = cv2.resize(frame, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")


def build_messages(frames: np.ndarray, fps: float) -> list[dict[str, Any]]:
    """System prompt + one user message with the 1-fps frames of ``[N, H, W, 3]`` uint8 RGB as data URLs."""
    idx = sample_indices(len(frames), fps)
    content: list[dict[str, Any]] = [
        {"type": "text", "text": f"{len(idx)} frames at 1 fps follow. Return the JSON object."}
    ]
    content += [{"type": "image_url", "image_url": {"url": encode_frame(frames[i])}} for i in idx]
    return [{"role": "system", "content": PROMPT}, {"role": "user", "content": content}]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def validate_response(text: str) -> dict[str, Any]:
    """Parse and check a reply against Table 2; returns the object or raises ``VLMResponseError``."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise VLMResponseError(f"reply is not a bare JSON object ({e})") from e
    if not isinstance(obj, dict):
        raise VLMResponseError(f"reply is JSON {type(obj).__name__}, expected an object")
    missing = [k for k in FIELDS if k not in obj]
    extra = [k for k in obj if k not in FIELDS]
    if missing or extra:
        raise VLMResponseError(f"top-level keys must be exactly {list(FIELDS)}; missing {missing}, unexpected {extra}")

    caption = obj["dense_caption"]
    if not isinstance(caption, str):
        raise VLMResponseError("dense_caption must be a string")
    words = len(caption.split())
    if not CAPTION_WORDS[0] <= words <= CAPTION_WORDS[1]:
        raise VLMResponseError(f"dense_caption has {words} words, must have {CAPTION_WORDS[0]}-{CAPTION_WORDS[1]}")
    if not (_is_int(obj["vlm_entity_density"]) and obj["vlm_entity_density"] in (1, 2, 3)):
        raise VLMResponseError(f"vlm_entity_density must be the integer 1, 2 or 3, got {obj['vlm_entity_density']!r}")
    q = obj["vlm_quality"]
    if not (_is_number(q) and float(q) in (1.0, 2.0, 3.0, 4.0, 5.0)):
        raise VLMResponseError(f"vlm_quality must be one of 1.0, 2.0, 3.0, 4.0, 5.0, got {q!r}")
    flags = obj["reject_flags"]
    if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
        raise VLMResponseError("reject_flags must be a list of strings")
    unknown = [f for f in flags if f not in REJECT_FLAGS]
    if unknown:
        raise VLMResponseError(f"reject_flags has unknown flags {unknown}; allowed: {list(REJECT_FLAGS)}")
    if len(set(flags)) != len(flags):
        raise VLMResponseError("reject_flags must not contain duplicates")
    if obj["scene_type"] not in SCENE_TYPES:
        raise VLMResponseError(f"scene_type must be one of {list(SCENE_TYPES)}, got {obj['scene_type']!r}")

    tr = obj["scene_transition"]
    if not isinstance(tr, dict) or sorted(tr) != sorted(TRANSITION_FIELDS):
        raise VLMResponseError(f"scene_transition must be an object with exactly the keys {list(TRANSITION_FIELDS)}")
    if tr["label"] not in TRANSITION_LABELS:
        raise VLMResponseError(f"scene_transition.label must be one of {list(TRANSITION_LABELS)}, got {tr['label']!r}")
    if not (_is_int(tr["count"]) and tr["count"] >= 0):
        raise VLMResponseError(f"scene_transition.count must be a non-negative integer, got {tr['count']!r}")
    ts = tr["timestamps_sec"]
    if not (isinstance(ts, list) and all(_is_number(t) for t in ts)):
        raise VLMResponseError("scene_transition.timestamps_sec must be a list of numbers")
    if tr["count"] != len(ts):
        raise VLMResponseError(f"scene_transition.count is {tr['count']} but timestamps_sec has {len(ts)} entries")
    if not isinstance(tr["evidence"], str):
        raise VLMResponseError("scene_transition.evidence must be a string")
    return obj


def to_record(obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A validated reply -> ``(caption, metrics)`` with the flat ``metrics.vlm_*`` keys."""
    tr = obj["scene_transition"]
    metrics = {
        "metrics.vlm_entity_density": int(obj["vlm_entity_density"]),
        "metrics.vlm_quality": float(obj["vlm_quality"]),
        "metrics.vlm_reject_flags": list(obj["reject_flags"]),
        "metrics.vlm_scene_type": obj["scene_type"],
        "metrics.vlm_transition_label": tr["label"],
        "metrics.vlm_transition_count": int(tr["count"]),
    }
    return obj["dense_caption"].strip(), metrics


_BEARER = re.compile(r"(?i)(bearer|basic)\s+[^\s\"',;]+")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s\"']*@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:api[_-]?key|key|token|access[_-]?token|auth|password|secret)=)[^&#\s\"']*")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with credentials replaced by ``<redacted>``: the given secret values, ``Bearer``/``Basic``
    tokens, URL user:password parts and key-like query parameters; for every error that is stored or printed."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<redacted>")
            quoted = urllib.parse.quote(secret, safe="")
            if quoted != secret:
                text = text.replace(quoted, "<redacted>")
    text = _BEARER.sub(lambda m: f"{m.group(1)} <redacted>", text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}<redacted>@", text)
    return _SECRET_QUERY.sub(lambda m: f"{m.group(1)}<redacted>", text)


class ChatClient:
    """Minimal OpenAI-compatible ``POST {endpoint}/chat/completions`` client on ``urllib``.

    Every error it raises is passed through `redact` (the key, and the credentials an endpoint URL may
    carry): a server that echoes the request headers must not put the key into meta.json or the summary.
    """

    def __init__(self, config: VLMConfig):
        self.config = config
        self.url = config.endpoint.rstrip("/") + "/chat/completions"
        parts = urllib.parse.urlsplit(self.url)
        self._url_secrets = tuple(v for v in (parts.username, parts.password) if v)
        self.shown_url = redact(self.url, self._url_secrets)  # the URL as errors name it

    def _error(self, message: str) -> RuntimeError:
        """A ``vlm.http`` error with every credential removed."""
        key = os.environ.get(self.config.api_key_env) or ""
        return RuntimeError(redact(message, (key, *self._url_secrets)))

    def complete(self, messages: list[dict[str, Any]]) -> str:
        """Send one request and return ``choices[0].message.content``."""
        body = {"model": self.config.model, "messages": messages, "temperature": 0, "seed": 0, **self.config.extra_body}
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read(500).decode(errors="replace")
            raise self._error(f"vlm.http: {self.shown_url} returned HTTP {e.code}: {detail}") from None
        except (OSError, http.client.HTTPException, ValueError) as e:  # URLError, timeouts, bad JSON, bad URL
            raise self._error(f"vlm.http: request to {self.shown_url} failed: {e}") from None
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise self._error(f"vlm.http: {self.shown_url} reply has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise self._error(
                f"vlm.http: {self.shown_url} reply content is {type(content).__name__}, expected a string"
            )
        return content


def caption_frames(frames: np.ndarray, fps: float, config: VLMConfig) -> tuple[str, dict[str, Any]]:
    """Caption ``[N, H, W, 3]`` uint8 RGB frames; returns ``(caption, metrics)`` or raises ``VLMResponseError``.

    Each invalid reply is answered with the validation error and the request repeated, at most
    ``config.max_retries`` times.
    """
    client = ChatClient(config)
    messages = build_messages(frames, fps)
    errors: list[str] = []
    for _attempt in range(config.max_retries + 1):
        content = client.complete(messages)
        try:
            return to_record(validate_response(content))
        except VLMResponseError as e:
            errors.append(str(e))
            messages = messages + [
                {"role": "assistant", "content": content},
                {
                    "role": "user",
                    "content": (
                        f"Your reply was invalid: {e}. Return only the corrected JSON object with exactly the six "
                        "required keys."
                    ),
                },
            ]
    raise VLMResponseError(f"no valid reply after {config.max_retries + 1} attempts: " + " | ".join(errors))
