"""Text-condition encoders for the routes: real UMT5 from a local folder, or a tiny deterministic one.

Both return ``(embeds [B, L, D], mask bool [B, L])`` with padded positions zeroed, which is how
diffusers' ``WanPipeline._get_t5_prompt_embeds`` feeds the Wan transformer (no attention mask in
cross-attention; padding is zeros).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch


class TextEncoderError(RuntimeError):
    """A text encoder could not be loaded (the message names the path and what was missing)."""


def zero_padding(embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero ``embeds [B, L, D]`` where ``mask [B, L]`` is False (Wan's padding convention)."""
    return embeds * mask.to(embeds.dtype).unsqueeze(-1)


class HashingTextEncoder(torch.nn.Module):
    """Tiny deterministic text encoder for the embedded default (NOT a language model).

    Each lower-cased word is hashed with BLAKE2b (stable across processes, unlike Python's salted
    ``hash()``) into one of ``vocab_size`` buckets; a bucket's vector comes from a fixed table drawn
    from ``torch.Generator().manual_seed(seed)``. There are no weights to download or train: the same
    config gives the same features on every machine. Captions of the procedural worlds differ in a few
    words, which is all the tiny route needs to tell them apart.
    """

    def __init__(self, dim: int, max_length: int = 16, vocab_size: int = 4096, seed: int = 0) -> None:
        super().__init__()
        self.dim, self.max_length, self.vocab_size, self.seed = dim, max_length, vocab_size, seed
        table = torch.randn(vocab_size, dim, generator=torch.Generator().manual_seed(seed))
        # Non-persistent: regenerated from the seed, so checkpoints never carry it.
        self.register_buffer("table", table, persistent=False)

    def token_ids(self, caption: str) -> list[int]:
        """Bucket ids of the caption's words (at most ``max_length``)."""
        words = re.findall(r"[\w']+", caption.lower())[: self.max_length]
        return [
            int.from_bytes(hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest(), "little") % self.vocab_size
            for w in words
        ]

    @torch.no_grad()
    def forward(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``captions`` -> ``(embeds [B, max_length, dim], mask [B, max_length])``."""
        ids = torch.zeros(len(captions), self.max_length, dtype=torch.long)
        mask = torch.zeros(len(captions), self.max_length, dtype=torch.bool)
        for i, caption in enumerate(captions):
            tok = self.token_ids(caption)
            ids[i, : len(tok)] = torch.tensor(tok, dtype=torch.long)
            mask[i, : len(tok)] = True
        ids, mask = ids.to(self.table.device), mask.to(self.table.device)
        return zero_padding(self.table[ids], mask), mask


class UMT5TextEncoder(torch.nn.Module):
    """The real Wan text condition: ``transformers.UMT5EncoderModel`` + tokenizer from a local folder.

    ``path`` is either a diffusers checkpoint folder (with ``text_encoder/`` and ``tokenizer/``) or a
    folder holding both the model and the tokenizer. Nothing is downloaded (``local_files_only``).
    """

    def __init__(self, path: str | Path, max_length: int = 512, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        from transformers import AutoTokenizer, UMT5EncoderModel

        root = Path(path)
        if not root.is_dir():
            raise TextEncoderError(f"UMT5 text encoder folder not found: {root}")
        model_dir = root / "text_encoder" if (root / "text_encoder").is_dir() else root
        tok_dir = root / "tokenizer" if (root / "tokenizer").is_dir() else root
        if not (model_dir / "config.json").is_file():
            raise TextEncoderError(f"{model_dir / 'config.json'} missing: not a UMT5EncoderModel folder")
        self.max_length = max_length
        self.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
        self.model = UMT5EncoderModel.from_pretrained(
            str(model_dir), local_files_only=True, use_safetensors=True, dtype=dtype
        )

    @torch.no_grad()
    def forward(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``captions`` -> ``(embeds [B, max_length, D], mask [B, max_length])`` (padding zeroed)."""
        device = next(self.model.parameters()).device
        tok = self.tokenizer(
            captions,
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = tok.attention_mask.to(device).bool()
        embeds = self.model(tok.input_ids.to(device), tok.attention_mask.to(device)).last_hidden_state
        return zero_padding(embeds, mask), mask
