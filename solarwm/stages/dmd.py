"""Stage 3, DMD causal training with real and fake score networks (paper §4.3, eq. 3; "SGF" in the release).

Three roles of one route:

* ``generator``: the causal student, from the stage-2 EMA with the AnyFlow r-embedding dropped;
* ``real_score``: the frozen bidirectional stage-1 model (the teacher);
* ``fake_score``: a trainable copy of stage 1 (the critic), tracking the student's distribution.

The codec and text encoder are shared by the three (loaded once). Each student update runs a detached
rollout-and-replay: a no-grad few-step rollout under the inference rule with one random exit step for all
blocks (the exit step's x0 is committed to the cache), then ONE gradient-carrying teacher-forced replay of
all blocks from their exit-step inputs over the committed history. The replay's x0 is re-noised at a
shifted score timestep (sigma in [0.02, 0.98]); the gradient is ``(fake - real) / mean|x - real|`` in x0
space, with the real score under CFG ``cond + g·(cond - uncond)``, and the surrogate loss is
``0.5·MSE(x, (x - grad).detach())``. The critic minimises the flow loss on generated samples.

Lightning manual optimisation: the critic updates every outer step, the student on every
``student_update_every``-th (before that step's critic update). All randomness comes from a generator
seeded by (seed, outer step) and, per sample, from a stream keyed by the sample's ``sample_index``, so a
resumed run continues exactly as an uninterrupted one and N DDP ranks train as one process. Under DDP each
backward touches one role only: use ``strategy: ddp_find_unused_parameters_true``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.cli import OptimizerCallable

from solarwm.backbones.base import BackboneAdapter
from solarwm.objectives.dmd import dmd_gradient, dmd_surrogate
from solarwm.objectives.flow_matching import shift_sigmas
from solarwm.objectives.rng import RandomSource, SampleRNG, randint, randn
from solarwm.rollout.engine import Rollout, block_conditions
from solarwm.stages.base import StageModule
from solarwm.stages.causal import CausalGenerateMixin, load_init, per_frame, set_sink


@dataclass
class DMDInit:
    """Where DMD's roles start: ``generator`` from stage 2, ``score`` (real and fake) from stage 1.

    ``*_command``: the command that makes each (named in the error when the path is missing).
    """

    generator: str
    score: str
    generator_command: str | None = None
    score_command: str | None = None


@dataclass
class RolloutStream:
    """One student rollout continued across outer steps (``DMDModule(stream_blocks=...)``)."""

    cond: dict[str, Any]  # the clip's conditions (every latent frame's camera)
    anchor: torch.Tensor  # [B, C, a, h, w] the clean anchor latents
    clip: torch.Tensor  # [B, C, f, h, w] the clip's latents (for ``regression_weight``)
    cache: Any  # the student's KV cache, carried from step to step
    noise: SampleRNG  # the rollout's per-sample noise streams
    index: torch.Tensor  # [B] the clip's sample indices
    blocks: list[slice]  # the clip's full causal blocks, in order
    next: int = 0  # the next block to generate
    last: torch.Tensor | None = None  # [B, C, 2, h, w] the last two latent frames generated (detached)


def student_optimizer(params: Any) -> torch.optim.Optimizer:
    """The reference's student optimiser: AdamW lr 2e-6, betas (0, 0.999), no weight decay."""
    return torch.optim.AdamW(params, lr=2e-6, betas=(0.0, 0.999), weight_decay=0.0)


def critic_optimizer(params: Any) -> torch.optim.Optimizer:
    """The reference's critic optimiser: AdamW lr 4e-7, betas (0, 0.999), no weight decay."""
    return torch.optim.AdamW(params, lr=4e-7, betas=(0.0, 0.999), weight_decay=0.0)


class DMDModule(CausalGenerateMixin, StageModule):
    """LightningModule of eq. (3): ``generator``, ``real_score``, ``fake_score`` of one route.

    Args:
        adapter: the route's adapter (in YAML: ``class_path`` + ``init_args``), kept as ``generator``; real and
            fake score are built as copies of it.
        init_from: where the roles start (``DMDInit``: the stage-2 checkpoint or export for the student, EMA
            when present, and the stage-1 one for real and fake score); None = all three as built (a fresh
            model: write it only on purpose).
        student_update_every: the student updates on outer steps k·N (k >= 1); the critic on every step.
        num_steps: rollout steps per block; one exit step in [0, num_steps) is drawn per rollout.
        guidance_scale: real-score CFG ``cond + g·(cond - uncond)`` (0 = no CFG; the Wan release uses 3).
        negative_prompt: the unconditional prompt.
        camera_guidance_scale: real-score camera guidance ``+ g·(cond - still)``, where ``still`` holds the
            first frame's camera for every frame (0 = off): it pushes the student away from the still camera a
            hedging score drifts towards, so the video moves as far as it is told.
        regression_weight: weight ``λ`` of a regression term added to the student's loss, ``λ·MSE(output, x0)`` over
            its generated latent frames against the clip it is conditioned on (0 = off, the plain DMD of eq. 3).
            DMD's own paper pairs its distribution loss with a regression loss; here the target is the real clip,
            which in a static world is fixed by the first frame and the camera except where content is unseen.
            With ``score_window`` (or ``stream_blocks``) it compares the judged slice with the clip's latents of the
            same frames, whose cameras the slice was generated under.
        score_min, score_max: clamp of the shifted score sigma.
        score_shift: the flow shift of the score (and critic) sigmas; None = the route's own shift (the
            reference; Self-Forcing shifts, DMD/DMD2 draw uniform timesteps, i.e. 1.0).
        grad_clip: gradient-norm clip of both optimisers.
        seed: base seed of the per-step generators.
        score_window: latent frames the teacher and the critic judge (None = the whole clip, the plain DMD). With a
            clip longer than it, the student rolls out the whole clip (past its causal window, so eviction is
            exercised) and both scores see one window-sized slice of it at a random start, its first latent
            re-anchored as a clean image latent (the decoded last frame before the slice, encoded alone), as
            Self-Forcing's long rollouts do for a teacher trained on short clips.
        sink_frames: the student's attention sink (``TFAnyFlowModule``); must match the stage-2 export's.
        stream_blocks: streaming long tuning (LongLive's): one student rollout is continued across outer steps on
            its own cache, ``stream_blocks`` new blocks a step, until the clip's cameras run out (then the next
            batch starts a new stream; batches meanwhile are not used). Each step's new blocks (with the last
            latent before them, re-anchored) are what both scores judge, ``score_window`` latents of them; the
            student's gradient flows through the new blocks' exit-step forwards only (the history is detached),
            and the critic trains on the same blocks. So the student learns from its own history minutes past
            the teacher's window at the cost of a short clip per step. None = off (each step rolls out its batch's
            clip). A resumed run starts a new stream.
    """

    stage_name = "dmd"
    automatic_optimization = False

    def __init__(
        self,
        adapter: BackboneAdapter,
        init_from: DMDInit | None = None,
        use_ema_init: bool = True,
        student_update_every: int = 5,
        num_steps: int = 4,
        guidance_scale: float = 3.0,
        negative_prompt: str = "",
        camera_guidance_scale: float = 0.0,
        regression_weight: float = 0.0,
        score_min: float = 0.02,
        score_max: float = 0.98,
        score_shift: float | None = None,
        grad_clip: float = 10.0,
        optimizer: OptimizerCallable = student_optimizer,
        critic_optimizer: OptimizerCallable = critic_optimizer,
        seed: int = 0,
        score_window: int | None = None,
        sink_frames: int = 0,
        stream_blocks: int | None = None,
    ) -> None:
        super().__init__(None, optimizer, None)
        self.save_hyperparameters(ignore=["adapter", "optimizer", "critic_optimizer"])
        generator = adapter
        if student_update_every < 1 or num_steps < 1 or not 0.0 <= score_min < score_max <= 1.0:
            raise ValueError("DMDModule: student_update_every, num_steps >= 1 and 0 <= score_min < score_max <= 1")
        if regression_weight < 0:
            raise ValueError(f"DMDModule: regression_weight must be >= 0, got {regression_weight}")
        if score_shift is not None and score_shift <= 0:
            raise ValueError(f"DMDModule: score_shift must be > 0 (or None for the route's shift), got {score_shift}")
        # Copies share the frozen codec and text encoder instead of duplicating them (loaded once).
        shared = {id(m): m for m in generator.frozen_parts().values()}
        real = copy.deepcopy(generator, memo=dict(shared))
        if init_from is not None:
            load_init(real, init_from.score, ("bidirectional",), init_from.score_command, use_ema_init)
            # The stage-2 flow map's r-embedding is dropped: the student is a plain t-conditioned causal model.
            generator.disable_flow_map()
            load_init(generator, init_from.generator, ("tf_anyflow", "dmd"), init_from.generator_command, use_ema_init,
                      ignore=("delta_embedding",))
        generator.disable_flow_map()
        set_sink(generator, sink_frames, None if init_from is None else init_from.generator)
        fake = copy.deepcopy(real, memo=dict(shared))
        real.requires_grad_(False).eval()
        self.generator, self.real_score, self.fake_score = generator, real, fake
        self.critic_optimizer_factory = critic_optimizer
        self.student_update_every, self.num_steps = student_update_every, num_steps
        self.guidance_scale, self.negative_prompt = guidance_scale, negative_prompt
        self.camera_guidance_scale, self.regression_weight = camera_guidance_scale, regression_weight
        self.score_min, self.score_max, self.grad_clip, self.seed = score_min, score_max, grad_clip, seed
        self.score_shift = generator.shift if score_shift is None else score_shift  # resolved once, at set-up
        if score_window is not None and score_window <= generator.clean_latent_frames:
            raise ValueError(
                f"DMDModule: score_window must exceed the anchor's {generator.clean_latent_frames} latent frames"
            )
        if stream_blocks is not None:
            seen = stream_blocks * generator.frames_per_block  # the new latents, plus the one before them
            if stream_blocks < 1 or score_window is None or not score_window <= seen + 1:
                raise ValueError(
                    f"DMDModule: stream_blocks needs a score_window of at most the {seen + 1} latent frames a step "
                    f"sees (stream_blocks={stream_blocks}, score_window={score_window})"
                )
        self.score_window, self.stream_blocks = score_window, stream_blocks
        self._stream: RolloutStream | None = None
        self.solver, self.sample_steps = "renoise", num_steps
        # Counters live in buffers so checkpoints carry them.
        self.register_buffer("outer_step", torch.zeros((), dtype=torch.long))
        self.register_buffer("student_steps", torch.zeros((), dtype=torch.long))
        self._student_updated = False

    @property
    def adapter(self) -> BackboneAdapter:
        """The student (what is exported, evaluated and rolled out)."""
        return self.generator

    def sharded_adapters(self) -> list[BackboneAdapter]:
        """All three roles' transformers are sharded (the frozen teacher too: it is as large as the student)."""
        return [self.generator, self.real_score, self.fake_score]

    def train(self, mode: bool = True) -> "DMDModule":
        """Train the student and the critic; the teacher stays in eval mode."""
        super().train(mode)
        self.real_score.eval()
        return self

    # ------------------------------------------------------------------ pieces of eq. 3
    def _rng(self, salt: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + int(self.outer_step) * 7 + salt)

    def draws(self, batch: dict[str, Any], rng: torch.Generator) -> tuple[int, SampleRNG]:
        """``(exit_step, per-sample streams)`` of one update, both from the step's ``rng``.

        The exit step is one for the whole global batch (every rank draws it from the same step seed);
        noise and score sigmas come from each sample's stream (keyed by its ``sample_index``), so a sample
        draws the same on any number of ranks.
        """
        exit_step = int(torch.randint(0, self.num_steps, (1,), generator=rng))
        salt = int(torch.randint(0, 2**62, (1,), generator=rng))
        return exit_step, SampleRNG(self.sample_index(batch), salt=salt, device=self.device)

    def rollout_and_replay(
        self, batch: dict[str, Any], exit_step: int, noise: SampleRNG, grad: bool
    ) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
        """``(x0 [B, C, f, h, w], cond, clean_latents)``: the student's generated video latents.

        Pass 1 (no grad): few-step rollout exiting at ``exit_step``, committing that step's x0. Pass 2
        (only with ``grad``): one teacher-forced replay of all blocks from their exit-step inputs.
        """
        gen = self.generator
        x0 = self.latents(batch)
        cond = gen.prepare_conditions(batch)
        rollout = Rollout(gen, self.num_steps, "renoise")
        clean = gen.clean_latent_frames
        with torch.no_grad():
            blocks = list(rollout.latent_blocks(dict(cond, anchor=x0[:, :, :clean]), noise, exit_step=exit_step))
        committed = torch.cat([b.x0 for b in blocks], 2)
        if not grad:
            return committed, cond, x0
        noisy = torch.cat([b.noisy for b in blocks], 2)
        sigma_pf = per_frame(gen, torch.full((x0.shape[0],), blocks[0].sigma, device=x0.device), x0.shape[2])
        flow = gen.forward_teacher_forcing(committed, noisy, sigma_pf, cond)
        output = noisy - sigma_pf[:, None, :, None, None] * flow
        return torch.cat([x0[:, :, :clean], output[:, :, clean:]], 2), cond, x0

    def score_slice(
        self, x: torch.Tensor, cond: dict[str, Any], rng: torch.Generator, min_start: int = 0
    ) -> tuple[torch.Tensor, dict[str, Any], slice]:
        """``(x, cond, frames)`` cut to ``score_window`` latent frames at a random start >= ``min_start``
        (unchanged when the clip fits and ``min_start`` is 0); ``frames``: the slice's frames of ``x``.

        A slice that does not start at frame 0 gets a clean anchor made from the generated video (detached): the
        last pixel frame of its first latent, decoded and encoded alone, as the teacher saw image latents.
        """
        gen, f = self.generator, x.shape[2]
        if self.score_window is None or (f <= self.score_window and min_start == 0):
            return x, cond, slice(0, f)
        start = int(torch.randint(min_start, f - self.score_window + 1, (1,), generator=rng))
        frames = slice(start, start + self.score_window)
        piece = x[:, :, frames]
        clean = gen.clean_latent_frames
        if start > 0 and clean > 0:
            with torch.no_grad():
                last = gen.decode(x[:, :, start - 1 : start + 1].detach().float())[:, :, -1:]
                anchor = gen.encode(last).to(piece.dtype)[:, :, :clean]
            piece = torch.cat([anchor, piece[:, :, clean:]], 2)
        return piece, block_conditions(gen, cond, frames), frames

    def score_sigmas(self, batch_size: int, rng: RandomSource) -> torch.Tensor:
        """Per-sample score sigma ``[B]``: ``randint(0, 1000)/1000``, shifted (``score_shift``), clamped."""
        u = randint(1000, (batch_size,), rng, "cpu").double() / 1000.0
        return shift_sigmas(u, self.score_shift).clamp(self.score_min, self.score_max).float()

    def _renoise(self, x: torch.Tensor, rng: RandomSource) -> tuple[torch.Tensor, ...]:
        """``(noisy, noise, sigma_pf)``: ``x`` at a score sigma (its anchor frames stay clean at sigma 0)."""
        sigma = self.score_sigmas(x.shape[0], rng).to(x.device)
        noise = randn(x.shape, rng, x.device)
        noisy, sigma_pf = self.generator.noisy_input(x, noise, sigma)
        return noisy, noise, sigma_pf

    @staticmethod
    def _x0(
        adapter: BackboneAdapter, noisy: torch.Tensor, sigma_pf: torch.Tensor, cond: dict[str, Any]
    ) -> torch.Tensor:
        return noisy - sigma_pf[:, None, :, None, None] * adapter(noisy, sigma_pf, cond).float()

    def student_loss(self, batch: dict[str, Any], rng: torch.Generator) -> torch.Tensor:
        """DMD surrogate on one rollout-and-replay, plus ``regression_weight`` × its MSE to the clip (student only)."""
        exit_step, streams = self.draws(batch, rng)
        output, cond, x0 = self.rollout_and_replay(batch, exit_step, streams, grad=True)
        if self.score_window is not None:
            output, cond, frames = self.score_slice(output, cond, rng)
            x0 = x0[:, :, frames]  # the clip's latents under the slice's cameras (its first is masked)
        return self.judged_loss(output, cond, streams, x0)

    def judged_loss(
        self, output: torch.Tensor, cond: dict[str, Any], streams: SampleRNG, x0: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The DMD surrogate of generated latents ``output [B, C, f, h, w]`` (carrying the student's gradient)
        as the teacher and the critic judge them under ``cond``; ``x0``: the clip, for ``regression_weight``."""
        with torch.no_grad():
            noisy, _, sigma_pf = self._renoise(output.detach(), streams)
            fake_x0 = self._x0(self.fake_score, noisy, sigma_pf, cond)
            cond_x0 = real_x0 = self._x0(self.real_score, noisy, sigma_pf, cond)
            if self.guidance_scale > 0:
                neg = self.generator.text_features({"caption": [self.negative_prompt] * output.shape[0]})[0]
                uncond_x0 = self._x0(self.real_score, noisy, sigma_pf, dict(cond, text_embeds=neg))
                real_x0 = real_x0 + self.guidance_scale * (cond_x0 - uncond_x0)
            if self.camera_guidance_scale > 0:
                still = dict(cond, c2w=cond["c2w"][:, :1].expand_as(cond["c2w"]).contiguous())
                still_x0 = self._x0(self.real_score, noisy, sigma_pf, still)
                real_x0 = real_x0 + self.camera_guidance_scale * (cond_x0 - still_x0)
            mask = self.generator.loss_mask(output)
            grad = dmd_gradient(output, fake_x0, real_x0, mask)
        loss = dmd_surrogate(output, grad, mask)
        if self.regression_weight > 0:
            loss = loss + self.regression_weight * self.generator.loss(output.float(), x0.float(), mask)
        return loss

    def critic_loss(self, batch: dict[str, Any], rng: torch.Generator) -> torch.Tensor:
        """Flow loss of the fake score on the student's generated latents (rollout without grad)."""
        exit_step, streams = self.draws(batch, rng)
        with torch.no_grad():
            generated, cond, _ = self.rollout_and_replay(batch, exit_step, streams, grad=False)
            generated, cond, _ = self.score_slice(generated, cond, rng)
        return self.critic_flow_loss(generated, cond, streams)

    def critic_flow_loss(self, generated: torch.Tensor, cond: dict[str, Any], streams: SampleRNG) -> torch.Tensor:
        """The fake score's flow loss on generated latents ``[B, C, f, h, w]`` (no gradient reaches them)."""
        with torch.no_grad():
            noisy, noise, sigma_pf = self._renoise(generated, streams)
        prediction = self.fake_score(noisy, sigma_pf, cond)
        return self.fake_score.loss(
            prediction, self.fake_score.target(generated, noise), self.fake_score.loss_mask(generated)
        )

    # ------------------------------------------------------------------ streaming long tuning
    def start_stream(self, batch: dict[str, Any], rng: torch.Generator) -> RolloutStream:
        """A new stream on ``batch``'s clip: its conditions, anchor and full blocks, an empty cache."""
        gen = self.generator
        with torch.no_grad():  # the conditions outlive this step's graph
            x0 = self.latents(batch)
            cond = gen.prepare_conditions(batch)
        blocks = [b for b in gen.block_slices(x0.shape[2]) if b.stop - b.start == gen.frames_per_block]
        if len(blocks) < self.stream_blocks:
            raise ValueError(
                f"DMDModule: a clip of {x0.shape[2]} latent frames has fewer than stream_blocks={self.stream_blocks} "
                "full blocks"
            )
        index = self.sample_index(batch)
        salt = int(torch.randint(0, 2**62, (1,), generator=rng))
        return RolloutStream(
            cond=cond,
            anchor=x0[:, :, : gen.clean_latent_frames],
            clip=x0,
            cache=gen.new_cache(*x0.shape[-2:]),
            noise=SampleRNG(index, salt=salt, device=self.device),
            index=index,
            blocks=blocks,
        )

    def continue_stream(
        self, batch: dict[str, Any], rng: torch.Generator, grad: bool
    ) -> tuple[torch.Tensor, dict[str, Any], int, torch.Tensor]:
        """``(x [B, C, f, h, w], cond, min_start, clip)``: the stream's next ``stream_blocks`` blocks after the (up
        to two, detached) latent frames before them; ``min_start``: where a slice may start so that its first
        latent, if not the clip's anchor, is re-anchored from the frame before it; ``clip``: the clip's latents
        of the same frames.

        Starts a stream on ``batch`` when there is none or its clip has no room left. With ``grad`` the new
        blocks carry the student's gradient through their exit-step forwards (one exit step for all of them).
        """
        gen = self.generator
        stream = self._stream
        if stream is None or stream.next + self.stream_blocks > len(stream.blocks):
            stream = self._stream = self.start_stream(batch, rng)
        exit_step = int(torch.randint(0, self.num_steps, (1,), generator=rng))
        rollout = Rollout(gen, self.num_steps, "renoise")
        new = stream.blocks[stream.next : stream.next + self.stream_blocks]
        pieces = []
        for frames in new:
            block_cond = block_conditions(gen, stream.cond, frames)
            block = rollout.block(block_cond, stream.anchor, frames, stream.cache, stream.noise, exit_step, grad=grad)
            pieces.append(block.x0)
        x, first, min_start = torch.cat(pieces, 2), new[0].start, 0
        if stream.last is not None:  # judged after the frames before them, as a slice of one long rollout is
            x, first, min_start = torch.cat([stream.last, x], 2), first - stream.last.shape[2], stream.last.shape[2] - 1
        stream.last, stream.next = x[:, :, -2:].detach(), stream.next + len(new)
        frames = slice(first, new[-1].stop)
        return x, block_conditions(gen, stream.cond, frames), min_start, stream.clip[:, :, frames]

    def stream_piece(
        self, batch: dict[str, Any], rng: torch.Generator, grad: bool
    ) -> tuple[torch.Tensor, dict[str, Any], SampleRNG, torch.Tensor]:
        """``(piece, cond, streams, clip)``: the stream's next blocks (``continue_stream``) cut to ``score_window``
        at a random start, this step's score draws, and the clip's latents under the piece's cameras."""
        x, cond, min_start, clip = self.continue_stream(batch, rng, grad)
        _, streams = self.draws({"sample_index": self._stream.index}, rng)
        piece, cond, frames = self.score_slice(x, cond, rng, min_start)
        return piece, cond, streams, clip[:, :, frames]

    # ------------------------------------------------------------------ Lightning
    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """``[student optimiser, critic optimiser]`` over the generator's and the fake score's trainable weights."""
        return [
            self.optimizer_factory(self.generator.trainable_parameters()),
            self.critic_optimizer_factory(self.fake_score.trainable_parameters()),
        ]

    def _update(self, optimizer: Any, loss: torch.Tensor) -> None:
        # All roles' gradients are cleared, not just this optimiser's: under FSDP the norm clip covers
        # every parameter with a gradient, and the other role's stale gradients must not count.
        self.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        self.clip_grad_norm(optimizer, self.grad_clip)
        optimizer.step()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """One outer step: maybe a student update (every N-th), then a critic update."""
        student_opt, critic_opt = self.optimizers()
        size = self.batch_size_of(batch)
        step = int(self.outer_step)
        self._student_updated = step > 0 and step % self.student_update_every == 0
        if self.stream_blocks is not None:  # both updates judge the stream's new blocks
            piece, cond, streams, clip = self.stream_piece(batch, self._rng(1), grad=self._student_updated)
            student_loss = lambda: self.judged_loss(piece, cond, streams, clip)  # noqa: E731
            critic_loss = lambda: self.critic_flow_loss(piece.detach(), cond, streams)  # noqa: E731
        else:
            student_loss = lambda: self.student_loss(batch, self._rng(1))  # noqa: E731
            critic_loss = lambda: self.critic_loss(batch, self._rng(2))  # noqa: E731
        if self._student_updated:
            loss = student_loss()
            self.check_finite(loss, batch, batch_idx)
            self._update(student_opt, loss)
            self.student_steps += 1
            self.log("train/student_loss", loss.detach(), prog_bar=True, batch_size=size, sync_dist=True)
        critic = critic_loss()
        self.check_finite(critic, batch, batch_idx)
        self._update(critic_opt, critic)
        self.log("train/critic_loss", critic.detach(), prog_bar=True, batch_size=size, sync_dist=True)
        self.outer_step += 1
        return critic.detach()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """The critic's flow loss on a seeded rollout (how far the fake score trails the student)."""
        loss = self.critic_loss(batch, torch.Generator().manual_seed(1234 + batch_idx))
        self.log("val/critic_loss", loss, prog_bar=True, sync_dist=True, batch_size=self.batch_size_of(batch))
        return loss

    def ema_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The EMA averages the student only."""
        return [(f"generator.{n}", p) for n, p in self.generator.named_parameters() if p.requires_grad]

    def ema_step(self) -> int | None:
        """Student updates so far when this batch made one, else None (the EMA folds in student steps only)."""
        return int(self.student_steps) if self._student_updated else None
