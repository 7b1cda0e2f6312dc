"""fp32 weights as two 16-bit halves: the bf16 top half and the int16 bottom half, bit for bit.
The split-SGD optimizer and its fused kernel both build on these; this module imports neither."""

from __future__ import annotations

import sys

import torch

if sys.byteorder != "little":  # the int16 pair views below assume little-endian words
    raise ImportError("split-SGD needs a little-endian machine")


def split_fp32(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(top half as bf16, bottom half as int16) of an fp32 tensor, bit for bit. On a
    little-endian machine an fp32 is the int16 pair (low, high): a view, then two copies."""
    pairs = w.detach().float().contiguous().view(torch.int16).view(*w.shape, 2)
    return pairs[..., 1].contiguous().view(torch.bfloat16), pairs[..., 0].contiguous()


def join_fp32(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The fp32 tensor whose top half is `hi` (bf16) and bottom half `lo` (int16): one copy."""
    return torch.stack((lo, hi.view(torch.int16)), dim=-1).view(torch.float32).view(hi.shape)


def truncate_to_bf16(w: torch.Tensor) -> torch.Tensor:
    """bf16 of the top 16 bits of each fp32 value (what split-SGD's forward sees)."""
    return split_fp32(w)[0]
