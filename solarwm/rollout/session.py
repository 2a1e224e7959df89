"""A rollout as a stepwise session: feed the cameras of the next block, get its frames.

``RolloutSession`` holds everything a causal rollout carries from block to block — the sliding-window
KV cache, the anchor latent, the text features, the streaming decoder, the route's per-block condition
stream (the I2V route's ``y``), the noise generator and the camera track so far — and nothing about the
future, so a session has no length: ``step(c2w_block)`` takes the cameras of the next block's pixel
frames and returns that block's decoded frames. ``solarwm predict`` (``write_rollout``), ``solarwm play``
and the Gymnasium environment are all sessions; for the same seed and cameras they give the same frames.

The frame rule: latent frame ``i`` decodes to the pixel frames ``(p[i-1], p[i]]`` (latent 0 to frame 0),
``p = adapter.latent_to_pixel_frame``, and its camera is that of pixel frame ``p[i]`` (the last of its
group; a route may pick another frame of the group: ``adapter.latent_camera_frames``, e.g. the first for an
imported official model). A block of ``frames_per_block`` latent frames therefore covers ``p[e-1] - p[s-1]``
pixel frames (Wan, 3 latents per block: 9 for the first block, 12 after it).

``state_dict()`` / ``load_state_dict()`` (and ``fork()``) branch a world: two sessions loaded from one
state start from identical history and continue bit for bit alike under the same cameras.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from solarwm.backbones.base import BackboneAdapter
from solarwm.camera.trajectory import Trajectory
from solarwm.rollout.engine import Rollout, Solver


class SessionError(ValueError):
    """A session was stepped with cameras that do not fit its next block, or cannot do what was asked."""


def _restore(target: dict[str, Any], saved: dict[str, Any]) -> None:
    """Copy ``saved`` into ``target`` in place (nested dicts too): closures keep reading the same dicts."""
    for key, value in saved.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _restore(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    for key in set(target) - set(saved):
        del target[key]


def frame_tensor(image: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[1, 3, H, W]`` in [-1, 1] from a uint8 ``[H, W, 3]`` image (a float ``[1, 3, H, W]`` passes through)."""
    if isinstance(image, torch.Tensor) and image.dim() == 4:
        return image.float()
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise SessionError(
            f"first frame must be uint8 [H, W, 3] or float [1, 3, H, W], got {array.dtype} {list(array.shape)}"
        )
    return (torch.from_numpy(array.copy()).permute(2, 0, 1)[None].float() / 127.5 - 1.0).clamp(-1.0, 1.0)


class RolloutSession:
    """One open-ended causal rollout, stepped one block at a time.

    Args:
        adapter: a route adapter with causal weights (stage 2 or 3), in eval mode.
        first_frame: uint8 ``[H, W, 3]`` or float ``[1, 3, H, W]`` in [-1, 1], at the generated size.
        caption: the text prompt.
        K: pixel intrinsics ``(fx, fy, cx, cy)`` of the generated frames, used for every frame unless a
            step gives its own.
        fps: frames per second of the world (recorded with the camera track).
        seed: the noise seed (same seed and cameras, same frames).
        num_steps: denoising steps per block.
        solver: ``renoise`` or ``flowmap`` (``solarwm.rollout.engine``).
    """

    def __init__(
        self,
        adapter: BackboneAdapter,
        first_frame: np.ndarray | torch.Tensor,
        caption: str,
        K: Any,
        fps: float,
        seed: int = 0,
        num_steps: int = 4,
        solver: Solver = "renoise",
    ) -> None:
        self.adapter, self.caption, self.fps, self.seed = adapter, caption, float(fps), int(seed)
        self.rollout = Rollout(adapter, num_steps, solver)
        self.num_steps, self.solver = num_steps, solver
        device = next(adapter.parameters()).device
        self.first_frame = frame_tensor(first_frame).to(device)
        self.height, self.width = (int(v) for v in self.first_frame.shape[-2:])
        self.K = torch.as_tensor(np.asarray(K, dtype=np.float32)).reshape(4)
        if not (torch.isfinite(self.K).all() and (self.K[:2] > 0).all()):
            raise SessionError(
                f"K must be 4 finite pixel intrinsics with positive focal lengths, got {self.K.tolist()}"
            )
        self._static = self._static_conditions()
        self.anchor = adapter.encode(self.first_frame[:, :, None]).float()  # [1, C, 1, h, w]
        self.generator = torch.Generator(device=device).manual_seed(self.seed)
        self.cache = adapter.new_cache(*self.anchor.shape[-2:])
        self.decoder = adapter.stream_decoder()
        self.extras = adapter.frame_condition_stream(self.first_frame)
        self.latent_frames = 0  # latent frames generated so far
        self.blocks = 0
        self._c2w: list[np.ndarray] = []  # the camera track so far, one [n, 4, 4] array per block
        self._K: list[np.ndarray] = []

    @torch.no_grad()
    def _static_conditions(self) -> dict[str, Any]:
        """The conditions that do not change per block (text features, image size, route extras such as H3's
        image anchor), from ``prepare_conditions`` on the shortest valid clip; per-frame entries are dropped."""
        adapter = self.adapter
        frames = next(f for f in range(1, 1024) if adapter.valid_num_frames(f))
        device = self.first_frame.device
        batch = {
            "caption": [self.caption],
            "c2w": torch.eye(4, dtype=torch.float64, device=device).expand(1, frames, 4, 4),
            "K": self.K.to(device).expand(1, frames, 4),
            "image_size": (self.width, self.height),
            "first_frame": self.first_frame,
        }
        cond = adapter.prepare_conditions(batch)
        names = set(getattr(adapter, "per_frame_conditions", ("c2w", "K"))) | {"c2w", "K", "num_frames"}
        return {k: v for k, v in cond.items() if k not in names}

    # ------------------------------------------------------------------ the frame rule
    def block_pixel_frames(self, num_latents: int | None = None) -> int:
        """Pixel frames of the next block of ``num_latents`` latent frames (default: a whole block)."""
        start = self.latent_frames
        n = self.adapter.frames_per_block if num_latents is None else num_latents
        pix = self.adapter.latent_to_pixel_frame(start + n)
        return int(pix[-1]) + 1 if start == 0 else int(pix[-1] - pix[start - 1])

    @property
    def next_block_frames(self) -> int:
        """How many cameras the next (whole) ``step`` takes."""
        return self.block_pixel_frames()

    @property
    def num_frames(self) -> int:
        """Pixel frames generated so far."""
        return sum(len(c) for c in self._c2w)

    def _latents_for(self, frames: int) -> int:
        """The latent frames of a block of ``frames`` pixel frames (a whole block or a shorter last one)."""
        for n in range(self.adapter.frames_per_block, 0, -1):
            if self.block_pixel_frames(n) == frames:
                return n
        valid = [self.block_pixel_frames(n) for n in range(1, self.adapter.frames_per_block + 1)]
        raise SessionError(
            f"block {self.blocks} takes the cameras of {valid[-1]} pixel frames "
            f"(or {valid[:-1]} for a shorter last block), got {frames}"
        )

    # ------------------------------------------------------------------ stepping
    @torch.no_grad()
    def step(self, c2w_block: Any, K_block: Any = None) -> np.ndarray:
        """Generate the next block under the cameras ``c2w_block [n, 4, 4]`` (OpenCV c2w, metric, one per pixel
        frame; ``K_block [n, 4]`` or the session's K) and return its decoded frames, uint8 ``[n, H, W, 3]``."""
        from solarwm.camera.se3 import check_se3
        from solarwm.data.video import to_uint8_frames

        c2w = np.asarray(c2w_block, dtype=np.float64)
        if c2w.ndim != 3 or c2w.shape[1:] != (4, 4):
            raise SessionError(f"c2w_block must be [n, 4, 4], got {list(c2w.shape)}")
        check_se3(c2w)
        K = np.broadcast_to(self.K.numpy() if K_block is None else np.asarray(K_block, np.float32), (len(c2w), 4))
        n = self._latents_for(len(c2w))
        start = self.latent_frames
        pix = self.adapter.latent_camera_frames(start + n)[start:].numpy()  # the camera each latent carries
        local = pix - (0 if start == 0 else int(self.adapter.latent_to_pixel_frame(start)[-1]) + 1)
        device = self.anchor.device
        cond = dict(self._static, **self.extras(n))
        cond["c2w"] = torch.as_tensor(c2w[local], dtype=torch.float64, device=device)[None]
        cond["K"] = torch.as_tensor(np.ascontiguousarray(K[local]), dtype=torch.float32, device=device)[None]
        block = self.rollout.block(cond, self.anchor, slice(start, start + n), self.cache, self.generator)
        frames = to_uint8_frames(self.decoder(block.x0)[0])
        if len(frames) != len(c2w):
            raise SessionError(f"block {self.blocks} decoded {len(frames)} frames for {len(c2w)} cameras")
        self.latent_frames += n
        self.blocks += 1
        self._c2w.append(c2w.copy())
        self._K.append(np.array(K, dtype=np.float64))
        return frames

    def trajectory(self) -> Trajectory:
        """The camera track so far (one pose per generated pixel frame) as a ``Trajectory``."""
        c2w = np.concatenate(self._c2w) if self._c2w else np.zeros((0, 4, 4))
        K = np.concatenate(self._K) if self._K else np.zeros((0, 4))
        return Trajectory(c2w, K, self.fps, self.width, self.height)

    # ------------------------------------------------------------------ branching
    def state_dict(self) -> dict[str, Any]:
        """A deep copy of everything the next blocks depend on (cache, noise, decoder, condition stream, track)."""
        if getattr(self.decoder, "state", None) is None or getattr(self.extras, "state", None) is None:
            raise SessionError(
                f"{self.adapter.route}: this route's streaming decoder or condition stream cannot be forked"
            )
        return copy.deepcopy(
            {
                "cache": self.cache,
                "generator": self.generator.get_state(),
                "decoder": self.decoder.state,
                "extras": self.extras.state,
                "latent_frames": self.latent_frames,
                "blocks": self.blocks,
                "c2w": self._c2w,
                "K": self._K,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict`` of a session on the same adapter, first frame and caption)."""
        if getattr(self.decoder, "state", None) is None or getattr(self.extras, "state", None) is None:
            raise SessionError(
                f"{self.adapter.route}: this route's streaming decoder or condition stream cannot be forked"
            )
        state = copy.deepcopy(state)
        self.cache = state["cache"]
        self.generator.set_state(state["generator"])
        _restore(self.decoder.state, state["decoder"])
        _restore(self.extras.state, state["extras"])
        self.latent_frames, self.blocks = int(state["latent_frames"]), int(state["blocks"])
        self._c2w, self._K = list(state["c2w"]), list(state["K"])

    def fork(self) -> "RolloutSession":
        """A second session with this one's whole history (shares the adapter and the static conditions)."""
        other = copy.copy(self)
        other.generator = torch.Generator(device=self.anchor.device)
        other.decoder = self.adapter.stream_decoder()
        other.extras = self.adapter.frame_condition_stream(self.first_frame)
        other.load_state_dict(self.state_dict())
        return other


def write_rollout(
    adapter: BackboneAdapter,
    first_frame: torch.Tensor,
    c2w: torch.Tensor,
    K: torch.Tensor,
    caption: str,
    output: str | Path,
    fps: float,
    num_steps: int = 4,
    solver: Solver = "renoise",
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Roll out ``c2w [1, N, 4, 4]`` / ``K [1, N, 4]`` from ``first_frame [1, 3, H, W]`` straight into an mp4.

    A ``RolloutSession`` fed block by block from the track (the same code path as ``solarwm play``), so
    memory is flat in N and the frames equal a session's under the same seed and cameras; blocks are
    encoded as they are generated, and the mp4 appears only when the rollout finished. A progress bar
    shows generated frames per second.
    """
    from tqdm import tqdm

    from solarwm.data.video import VideoWriter

    track = c2w[0].detach().cpu().double().numpy()
    intrinsics = K[0].detach().cpu().float().numpy()
    session = RolloutSession(adapter, first_frame, caption, intrinsics[0], fps, seed, num_steps, solver)
    start = time.perf_counter()
    with (
        VideoWriter(output, fps) as writer,
        tqdm(total=len(track), unit="frame", desc="rollout", disable=not progress, dynamic_ncols=True) as bar,
    ):
        pos = 0
        while pos < len(track):
            n = min(session.next_block_frames, len(track) - pos)
            frames = session.step(track[pos : pos + n], intrinsics[pos : pos + n])
            writer.write(frames)
            bar.update(len(frames))
            pos += n
        written = writer.num_frames
    seconds = time.perf_counter() - start
    return {"num_frames": written, "seconds": round(seconds, 3), "frames_per_second": round(written / seconds, 2)}
