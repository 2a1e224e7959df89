"""Visual and motion metrics of one clip (paper §5.4): saturation, VMAF Motion, cuts, flow, DOVER.

Each function takes decoded frames (uint8 RGB ``[N, H, W, 3]``) or a video path and returns
plain floats/ints; the stage layer (``stages.py``) decides which keys they become. Every
number comes from the library that defines it (OpenCV, FFmpeg's ``vmafmotion`` through PyAV,
PySceneDetect, UniMatch, DOVER) — nothing here re-derives a published metric by hand.
"""

from __future__ import annotations

import gc
import importlib
import re
from pathlib import Path
from typing import Any

import numpy as np

# Open-Sora's optical-flow scoring protocol (tools/scoring/optical_flow/inference.py):
# frames 0, 10, 20, 30; portrait frames are transposed to landscape; bilinear resize with
# align_corners=True to 320x576 (H x W); flow between consecutive sampled frames.
FLOW_FRAME_INDICES = (0, 10, 20, 30)
FLOW_SIZE = (320, 576)
SATURATION_MIN_FRAMES = 16

_VMAF_LINE = re.compile(r"VMAF Motion avg:\s*([-+0-9.eE]+|nan|inf)")


class MetricError(RuntimeError):
    """A metric could not be computed for a clip; ``check`` names the failed check."""

    def __init__(self, check: str, detail: str):
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


def evenly_spaced(num_frames: int, count: int) -> np.ndarray:
    """``count`` evenly spaced frame indices in ``[0, num_frames)``, all of them if fewer."""
    if num_frames <= count:
        return np.arange(num_frames)
    return np.unique(np.linspace(0, num_frames - 1, count).round().astype(np.int64))


def mean_saturation(frames: np.ndarray) -> float:
    """Mean HSV saturation (OpenCV scale 0–255) over >= 16 evenly spaced frames of ``[N, H, W, 3]`` RGB."""
    import cv2

    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise MetricError("saturation.frames", f"expected RGB frames [N,H,W,3] with N>0, got {frames.shape}")
    idx = evenly_spaced(len(frames), SATURATION_MIN_FRAMES)
    per_frame = [cv2.cvtColor(np.ascontiguousarray(frames[i]), cv2.COLOR_RGB2HSV)[..., 1].mean() for i in idx]
    return float(np.mean(per_frame))


def vmaf_motion(path: str | Path) -> float:
    """FFmpeg ``vmafmotion`` average of a video, exactly the "VMAF Motion avg" the filter logs.

    The filter logs its average (``motion_sum / nb_frames``, printed ``%.3f``) when the graph is
    freed; the per-frame ``lavfi.vmafmotion.score`` metadata is rounded to 2 decimals, so
    averaging it would not reproduce ``ffmpeg -i clip.mp4 -vf vmafmotion -f null -``. We
    therefore run the filter in a PyAV graph and capture that log line.
    """
    import av
    import av.filter
    import av.logging

    old_level = av.logging.get_level()
    old_skip = av.logging.get_skip_repeated()
    # Identical lines from consecutive clips (e.g. two static clips) must not be deduplicated.
    av.logging.set_skip_repeated(False)
    av.logging.set_level(av.logging.INFO)
    try:
        with av.logging.Capture(local=True) as logs:
            try:
                _run_vmafmotion_graph(str(path))
            except av.FFmpegError as e:
                raise MetricError("vmaf.decode", f"{path}: {e}") from e
            gc.collect()  # the filter's uninit (which logs the average) runs when the graph is freed
    finally:
        av.logging.set_level(old_level)
        av.logging.set_skip_repeated(old_skip)
    for _level, name, message in logs:
        if name == "vmafmotion" or "vmafmotion" in (name or ""):
            m = _VMAF_LINE.search(message)
            if m:
                return float(m.group(1))
    raise MetricError("vmaf.no_frames", f"{path}: vmafmotion logged no average (no decodable frames?)")


def _run_vmafmotion_graph(path: str) -> None:
    """Decode ``path`` through buffer -> vmafmotion -> buffersink and drop the output frames."""
    import av
    import av.filter

    with av.open(path) as container:
        if not container.streams.video:
            raise MetricError("vmaf.stream", f"{path}: no video stream")
        stream = container.streams.video[0]
        graph = av.filter.Graph()
        src = graph.add_buffer(template=stream)
        motion = graph.add("vmafmotion")
        sink = graph.add("buffersink")
        src.link_to(motion)
        motion.link_to(sink)
        graph.configure()
        for frame in container.decode(stream):
            graph.push(frame)
            _drain(graph)
        try:
            graph.push(None)
        except av.EOFError:
            pass
        _drain(graph)
        del src, motion, sink, graph


def _drain(graph: Any) -> None:
    """Pull every available frame out of a PyAV filter graph."""
    import av

    while True:
        try:
            graph.pull()
        except (av.BlockingIOError, av.EOFError):
            return


def scene_cuts(path: str | Path) -> int:
    """Number of cuts PySceneDetect's ``ContentDetector`` (default settings) finds (= scenes - 1)."""
    from scenedetect import ContentDetector, SceneManager, open_video

    try:
        video = open_video(str(path), backend="pyav")
    except Exception as e:  # scenedetect wraps backend errors in several types
        raise MetricError("cuts.open", f"{path}: {e}") from e
    manager = SceneManager()
    manager.add_detector(ContentDetector())
    manager.detect_scenes(video=video, show_progress=False)
    # start_in_scene=True: a clip without cuts is one scene, so cuts = scenes - 1 always holds.
    scenes = manager.get_scene_list(start_in_scene=True)
    return max(len(scenes) - 1, 0)


def flow_frame_indices(num_frames: int) -> list[int]:
    """Open-Sora's flow frame indices clipped to the frames available (out-of-range ones dropped)."""
    return [i for i in FLOW_FRAME_INDICES if i < num_frames]


def flow_frames(frames: np.ndarray) -> np.ndarray:
    """Open-Sora flow input: sampled frames, landscape, resized to 320x576.

    ``[N,H,W,3]`` uint8 -> ``[M,3,320,576]`` float32 0–255.
    """
    import torch
    import torch.nn.functional as F

    idx = flow_frame_indices(len(frames))
    if len(idx) < 2:
        raise MetricError("flow.frames", f"need >= 2 frames for flow, clip has {len(frames)}")
    x = torch.from_numpy(np.ascontiguousarray(frames[idx])).permute(0, 3, 1, 2).float()
    if x.shape[-2] > x.shape[-1]:
        x = x.transpose(-2, -1)
    x = F.interpolate(x, size=FLOW_SIZE, mode="bilinear", align_corners=True)
    return x.numpy()


def dis_flow_magnitude(frames: np.ndarray) -> float:
    """Mean optical-flow magnitude (pixels at 320x576) between consecutive Open-Sora-sampled frames, OpenCV DIS."""
    import cv2

    x = flow_frames(frames)  # [M, 3, 320, 576]
    gray = [cv2.cvtColor(np.clip(f.transpose(1, 2, 0).round(), 0, 255).astype(np.uint8), cv2.COLOR_RGB2GRAY) for f in x]
    dis = cv2.DISOpticalFlow_create(cv2.DISOPTICAL_FLOW_PRESET_MEDIUM)
    mags = []
    for a, b in zip(gray[:-1], gray[1:]):
        flow = dis.calc(a, b, None)  # [H, W, 2] pixels
        mags.append(float(np.linalg.norm(flow, axis=-1).mean()))
    return float(np.mean(mags))


class UniMatchScorer:
    """Open-Sora's UniMatch/GMFlow motion score from a local checkpoint (mean |flow| over x/y, pixels at 320x576).

    Needs the UniMatch model code importable as ``unimatch.unimatch`` (the autonomousvision/unimatch
    repository on ``PYTHONPATH``) and the ``gmflow-scale2-regrefine6-mixdata-train320x576`` checkpoint.
    """

    def __init__(self, checkpoint: str | Path, device: str = "cpu"):
        import torch

        unimatch_cls = import_unimatch()
        self.device = torch.device(device)
        self.model = unimatch_cls(
            feature_channels=128,
            num_scales=2,
            upsample_factor=4,
            num_head=1,
            ffn_dim_expansion=4,
            num_transformer_layers=6,
            reg_refine=True,
            task="flow",
        )
        state = torch.load(str(checkpoint), map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"] if "model" in state else state)
        self.model.to(self.device).eval()

    def __call__(self, frames: np.ndarray) -> float:
        """Score ``[N, H, W, 3]`` uint8 RGB frames exactly as Open-Sora's flow scorer does."""
        import torch

        x = torch.from_numpy(flow_frames(frames)).to(self.device)
        with torch.no_grad():
            res = self.model(
                x[:-1].contiguous(),
                x[1:].contiguous(),
                attn_type="swin",
                attn_splits_list=[2, 8],
                corr_radius_list=[-1, 4],
                prop_radius_list=[-1, 1],
                num_reg_refine=6,
                task="flow",
                pred_bidir_flow=False,
            )
        return float(res["flow_preds"][-1].abs().mean().cpu())


def import_unimatch() -> type:
    """The UniMatch model class, or a clear error saying how to make it importable."""
    try:
        return importlib.import_module("unimatch.unimatch").UniMatch
    except ImportError as e:
        raise ImportError(
            "a UniMatch checkpoint is configured but the UniMatch model code is not importable "
            f"(`import unimatch.unimatch` failed: {e}); put the autonomousvision/unimatch repository on PYTHONPATH"
        ) from e


class DoverScorer:
    """DOVER technical and aesthetic scores from local weights, following DOVER's ``evaluate_one_video.py``.

    Needs the ``dover`` package (VQAssessment/DOVER) and ``decord`` importable, DOVER's option file
    (``dover.yml``) and the ``DOVER.pth`` weights. Returns the raw per-view head outputs averaged
    over clips (``technical`` -> ``metrics.dover_tech``, ``aesthetic`` -> ``metrics.dover_aes``).
    """

    _MEAN = (123.675, 116.28, 103.53)
    _STD = (58.395, 57.12, 57.375)

    def __init__(self, checkpoint: str | Path, options: str | Path, device: str = "cpu"):
        import torch
        import yaml

        datasets, models = import_dover()
        with open(options) as f:
            self.opt = yaml.safe_load(f)
        self.device = torch.device(device)
        self.model = models.DOVER(**self.opt["model"]["args"]).to(self.device)
        self.model.load_state_dict(torch.load(str(checkpoint), map_location="cpu", weights_only=True))
        self.sample_types = self.opt["data"]["val-l1080p"]["args"]["sample_types"]
        self.samplers = {}
        for stype, sopt in self.sample_types.items():
            if "t_frag" not in sopt:
                self.samplers[stype] = datasets.UnifiedFrameSampler(
                    sopt["clip_len"], sopt["num_clips"], sopt["frame_interval"]
                )
            else:
                self.samplers[stype] = datasets.UnifiedFrameSampler(
                    sopt["clip_len"] // sopt["t_frag"], sopt["t_frag"], sopt["frame_interval"], sopt["num_clips"]
                )
        self._decompose = datasets.spatial_temporal_view_decomposition

    def __call__(self, path: str | Path) -> dict[str, float]:
        """``{"technical": float, "aesthetic": float}`` for the video at ``path``."""
        import torch

        views, _ = self._decompose(str(path), self.sample_types, self.samplers)
        mean, std = torch.tensor(self._MEAN), torch.tensor(self._STD)
        for k, v in views.items():
            num_clips = self.sample_types[k].get("num_clips", 1)
            views[k] = (
                ((v.permute(1, 2, 3, 0) - mean) / std)
                .permute(3, 0, 1, 2)
                .reshape(v.shape[0], num_clips, -1, *v.shape[2:])
                .transpose(0, 1)
                .to(self.device)
            )
        scores = self.model(views)  # one tensor per view, in the order of ``views``
        return {k: float(s.mean()) for k, s in zip(views.keys(), scores)}


def import_dover() -> tuple[Any, Any]:
    """``(dover.datasets, dover.models)``, or a clear error saying how to make them importable."""
    try:
        return importlib.import_module("dover.datasets"), importlib.import_module("dover.models")
    except ImportError as e:
        raise ImportError(
            "DOVER weights are configured but the DOVER code is not importable "
            f"(`import dover.models` failed: {e}); install VQAssessment/DOVER and decord"
        ) from e
