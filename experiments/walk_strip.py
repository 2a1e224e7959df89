"""A PNG strip of what a causal export generates under commanded walks, next to the rendered truth.

    python experiments/walk_strip.py ADAPTER_DIR OUT.png [--steps 2] [--seed 0]

For each move (a forward walk, a strafe to the right, a turn), a fresh world of an unseen seed is rendered along
the commanded path (the truth), and `solarwm predict` generates it from the truth's first frame under that path
and under the opposite command (backward, strafe left, the other turn): 17 frames at 8 fps, 32x32, every other
frame shown. A model that follows the camera shows the truth's motion in the second row and the opposite motion
in the third. Prints each row's PSNR against the truth and the first frame repeated.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from solarwm.camera import trajectory as T
from solarwm.data.sources.synthetic import StartPose, describe_scene, make_scene, render_clip
from solarwm.data.video import read_video
from solarwm.datamodules.clips import resize_crop
from solarwm.metrics.video import per_video_psnr

#: move -> (its segment, the opposite command's segment), over 16 steps at 8 fps (2 s).
MOVES = {
    "forward walk 1.5 m/s": (T.forward(16, 3.0), T.backward(16, 3.0)),
    "strafe right 1 m/s": (T.lateral(16, 2.0), T.lateral(16, -2.0)),
    "turn 20 deg/s": (T.yaw_turn(16, 40.0), T.yaw_turn(16, -40.0)),
}
SIZE, FPS, WORLD_SEED = 32, 8.0, 2000


def _small(frames: np.ndarray) -> np.ndarray:
    """uint8 ``[N, H, W, 3]`` → the model's 32x32 windows (the datamodule's resize and centre crop)."""
    video = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    small, _ = resize_crop(video, np.zeros((len(frames), 4)), SIZE, SIZE)
    return small.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    """`solarwm test`'s PSNR (generated frames only) of uint8 videos ``[F, H, W, 3]``."""
    def video(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).permute(3, 0, 1, 2)[None].double() / 127.5 - 1.0

    return float(per_video_psnr(video(a), video(b))[0])


def _predict(adapter: str, first: Path, caption: str, traj: T.Trajectory, work: Path, name: str, steps: int,
             seed: int) -> np.ndarray:
    path = T.save_trajectory(traj, work / f"{name}.json")
    out = work / f"{name}.mp4"
    subprocess.run(["solarwm", "predict", "--adapter", adapter, "--first_frame", str(first), "--caption", caption,
                    "--trajectory", str(path), "--output", str(out), "--width", str(SIZE), "--height", str(SIZE),
                    "--num_steps", str(steps), "--seed", str(seed), "--progress", "false"],
                   check=True, stdout=subprocess.DEVNULL)
    return read_video(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=2, help="steps per block (recipes/tiny_dmd.yaml: 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows, figures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, (move, (segment, opposite)) in enumerate(MOVES.items()):
            rng = np.random.default_rng([WORLD_SEED, i])
            start = StartPose.sample(rng)
            pose = dict(fps=FPS, width=96, height=64, fov_x_deg=start.fov_x, start=(0.0, 0.0, start.z),
                        start_yaw=start.yaw, start_pitch=start.pitch)
            traj, back = T.compose_segments([segment], **pose), T.compose_segments([opposite], **pose)
            scene = make_scene(rng, np.concatenate([traj.c2w, back.c2w]))
            truth_full = render_clip(scene, traj)
            first = work / f"first{i}.png"
            Image.fromarray(truth_full[0]).save(first)
            caption = describe_scene(scene)
            truth = _small(truth_full)
            own = _predict(args.adapter, first, caption, traj, work, f"own{i}", args.steps, args.seed)
            other = _predict(args.adapter, first, caption, back, work, f"other{i}", args.steps, args.seed)
            static = np.repeat(truth[:1], len(truth), axis=0)
            figures[move] = {"psnr_commanded": round(_psnr(own, truth), 2),
                             "psnr_opposite_command": round(_psnr(other, truth), 2),
                             "psnr_static": round(_psnr(static, truth), 2)}
            for video in (truth, own, other):
                rows.append(np.concatenate(list(video[::2]), axis=1))
            rows.append(np.zeros_like(rows[-1][:2]))
    image = Image.fromarray(np.concatenate(rows, axis=0))
    image.resize((image.width * 3, image.height * 3), Image.NEAREST).save(args.out)
    print(json.dumps(figures, indent=1))
    print(f"wrote {args.out} (per move: truth, commanded, opposite command)")


if __name__ == "__main__":
    main()
