"""`solarwm fit | validate | test | predict --config recipes/<name>.yaml`.

``fit``/``validate``/``test`` are `LightningCLI` subcommands (``solarwm.lightning_cli.SolarCLI``): the recipe
YAML names every object as ``class_path`` + ``init_args`` and jsonargparse checks the whole file against the
constructors' signatures (unknown key, wrong type) before anything is built.

``predict`` is a plain typed function: one first frame (an image file or a clip folder), a caption and a
camera trajectory become an mp4: one clip from a bidirectional (stage-1) model, or a rollout of any length
from a causal (stage-2/3) one. The weights come from a Lightning checkpoint (``--checkpoint``, the model
built from ``--config``) or an exported adapter folder (``--adapter``), loaded by ``solarwm.loading``::

    solarwm predict --config recipes/tiny_bid.yaml --checkpoint runs/tiny/stage1/last.ckpt \\
        --first_frame frame.png --caption "a street" --trajectory traj.json --output out.mp4
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from solarwm.lightning_cli import (  # noqa: F401  (the recipe parser's names, as `solarwm.train_cli` has always had them)
    RecipeError,
    SolarCLI,
    TrainerConfigError,
    expand_configs,
    parse_recipe,
    resolve_interpolations,
)
from solarwm.loading import default_solver, load_generator, read_first_frame, recipe_dict

VERBS = ("fit", "validate", "test", "predict")


def predict(
    first_frame: str,
    trajectory: str,
    output: str,
    caption: str = "",
    config: str | None = None,
    checkpoint: str | None = None,
    adapter: str | None = None,
    num_frames: int | None = None,
    width: int | None = None,
    height: int | None = None,
    num_steps: int | None = None,
    seed: int = 0,
    use_ema: bool = True,
    progress: bool = True,
) -> int:
    """Generate video from a first frame, a caption and a camera trajectory into an mp4.

    A bidirectional (stage-1) model generates one clip; a causal (stage-2/3) model rolls out block by
    block on its sliding-window KV cache, for any length the trajectory covers, decoding and writing
    the mp4 as it goes (flat memory). Under ``torchrun --nproc_per_node P`` the processes split every
    call's tokens (Ulysses sequence parallelism) and rank 0 writes the mp4.

    Args:
        first_frame: an image file, or a canonical clip folder whose first frame is used.
        trajectory: a camera trajectory file (.json or .npz; `solarwm camera trajectory` writes long ones).
        output: the mp4 to write (only written when generation succeeds).
        caption: the text prompt.
        config: the recipe YAML (its `model` builds the stage; its `data` gives the clip geometry).
        checkpoint: a Lightning checkpoint of that recipe (needs --config).
        adapter: an exported adapter folder (`AdapterExport` / `save_adapter`), instead of --checkpoint.
        num_frames: frames to generate (default: the trajectory's length for a causal model, else the
            recipe's data.num_frames, else the trajectory's length); must follow the route's frame rule.
        width: output width (default: the recipe's data.width, else the trajectory's).
        height: output height (default: the recipe's data.height, else the trajectory's).
        num_steps: sampler steps (default: 4 per block for a causal model, 20 for a bidirectional one).
        seed: noise seed (the same seed gives the same video).
        use_ema: use the checkpoint's EMA average when it has one.
        progress: show a progress bar with generated frames per second.
    """
    from solarwm.camera.trajectory import load_trajectory
    from solarwm.datamodules.clips import fit_intrinsics, resize_crop

    for name, value in (("num_frames", num_frames), ("width", width), ("height", height), ("num_steps", num_steps)):
        if value is not None and value < 1:  # refused here: 0 would otherwise mean "the default" below
            raise ValueError(f"predict: --{name} must be >= 1, got {value}")
    if (checkpoint is None) == (adapter is None):
        raise ValueError("predict: give exactly one of --checkpoint (with --config) or --adapter")
    if checkpoint is not None and config is None:
        raise ValueError("predict: --checkpoint needs the --config recipe it was trained with")
    recipe = recipe_dict(config)
    data_args = (recipe.get("data") or {}).get("init_args") or {}
    traj = load_trajectory(trajectory)
    image = read_first_frame(first_frame)
    loaded = load_generator(adapter, config, checkpoint, use_ema)
    generator_model, causal, ema_used = loaded.model, loaded.causal, loaded.ema_used
    route = generator_model if causal else getattr(generator_model, "adapter", None)
    num_frames = num_frames or (len(traj) if causal else data_args.get("num_frames") or len(traj))
    width = width or data_args.get("width") or traj.width
    height = height or data_args.get("height") or traj.height
    if route is not None and not route.valid_num_frames(num_frames):
        raise ValueError(
            f"predict: --num_frames {num_frames} is not a valid length for route {route.route} "
            f"(needs {route.temporal_compression}*n + 1)"
        )
    if len(traj) < num_frames:
        raise ValueError(f"{trajectory}: trajectory has {len(traj)} frames, --num_frames is {num_frames} (no padding)")

    frame = torch.from_numpy(image).permute(2, 0, 1)[None]  # [1,3,H,W]
    frame, _ = resize_crop(frame, np.zeros((1, 4)), width, height)
    first = (frame / 127.5 - 1.0).clamp(-1, 1)
    c2w = torch.as_tensor(traj.c2w[:num_frames], dtype=torch.float64)[None]
    K = torch.as_tensor(
        fit_intrinsics(traj.K[:num_frames], traj.width, traj.height, width, height), dtype=torch.float32
    )[None]
    generator = torch.Generator().manual_seed(seed)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    sp = _launched_group()
    if sp is not None and route is not None:
        from solarwm.backbones.sequence_parallel import enable_sequence_parallel

        enable_sequence_parallel(route, sp)  # every rank holds its share of each block's tokens
    if causal and sp is not None and sp.rank != 0:  # rank 0 writes the video; the others roll out with it
        _follow_rollout(route.eval(), first, c2w, K, caption, traj.fps, num_steps or 4, default_solver(route), seed)
        return 0
    if causal:
        from solarwm.rollout.session import write_rollout

        stats = write_rollout(
            route.eval(),
            first,
            c2w,
            K,
            caption,
            out,
            traj.fps,
            num_steps or 4,
            default_solver(route),
            seed,
            progress=progress,
        )
    else:
        from solarwm.data.video import to_uint8_frames, write_video

        generator_model.eval()
        with torch.no_grad():
            video = generator_model.generate(
                first_frame=first,
                caption=[caption],
                c2w=c2w.float(),
                K=K,
                num_steps=num_steps or 20,
                generator=generator,
            )
        frames = to_uint8_frames(video[0])
        if sp is not None and sp.rank != 0:
            return 0
        write_video(out, frames, traj.fps)
        stats = {"num_frames": int(frames.shape[0])}
    print(
        json.dumps(
            {
                "output": str(out),
                "width": width,
                "height": height,
                "fps": traj.fps,
                "causal": causal,
                "weights": checkpoint or adapter,
                "ema": ema_used,
                **stats,
            }
        )
    )
    return 0


def _launched_group() -> Any:
    """Under ``torchrun --nproc_per_node P`` (``WORLD_SIZE`` > 1): the P processes as one sequence-parallel group."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch.distributed as dist

    from solarwm.kernels.ulysses import SequenceParallel

    if not dist.is_initialized():
        dist.init_process_group("gloo")  # predict runs on the CPU
    return SequenceParallel()


def _follow_rollout(
    adapter: Any, first: torch.Tensor, c2w: torch.Tensor, K: torch.Tensor, caption: str, fps: float,
    num_steps: int, solver: str, seed: int,
) -> None:
    """``write_rollout``'s blocks without the video: a non-writing rank's share of every block's collectives."""
    from solarwm.rollout.session import RolloutSession

    track = c2w[0].detach().cpu().double().numpy()
    intrinsics = K[0].detach().cpu().float().numpy()
    session = RolloutSession(adapter, first, caption, intrinsics[0], fps, seed, num_steps, solver)
    pos = 0
    while pos < len(track):
        n = min(session.next_block_frames, len(track) - pos)
        session.step(track[pos : pos + n], intrinsics[pos : pos + n])
        pos += n


@contextlib.contextmanager
def _output_folder(out: Path) -> Iterator[None]:
    """A failed or refused run removes the folders above ``out`` that it made (when they are still empty)."""
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]  # deepest first
    try:
        yield
    except BaseException:
        for folder in made:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def predict_parser() -> Any:
    """The ``solarwm predict`` parser: `predict`'s typed signature, ``--config`` being the recipe."""
    from jsonargparse import ArgumentParser

    # Not jsonargparse.auto_cli: it reserves --config for its own config file, and here
    # --config is the training recipe the checkpoint belongs to.
    parser = ArgumentParser(
        prog="solarwm predict", description=predict.__doc__.splitlines()[0], default_env=False, exit_on_error=False
    )
    parser.add_function_arguments(predict, as_positional=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``solarwm fit|validate|test|predict ...`` (``argv`` without the program name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "predict":
        kwargs = predict_parser().parse_args(argv[1:]).as_dict()
        with _output_folder(Path(kwargs["output"])):
            return predict(**kwargs)
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        SolarCLI(args=argv)
    except MisconfigurationException as e:  # Lightning's bad-configuration error, made one of ours
        raise TrainerConfigError(str(e)) from e
    return 0
