"""What every model's heads share: the ignored label, the task output, and the losses and targets that
BERT's heads, GPT, ELMo and the feature tagger compute alike. Nothing here knows a model's layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import BertConfig
from .packing import pad

IGNORE = -100  # the label of a position with no target: cross-entropy skips it (torch's default ignore_index)


@dataclass
class TaskOutput:
    loss: Tensor | None = None
    logits: Tensor | None = None  # [B, num_labels] / [B, T, num_labels] or [N, num_labels] / [B, C]
    start_logits: Tensor | None = None  # QA: [B, T] padded, [N] packed
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


def num_labels(config: BertConfig) -> int:
    """As transformers: the size of id2label when config.json has one, else num_labels, else 2."""
    id2label = config.extra.get("id2label")
    return len(id2label) if id2label else int(config.extra.get("num_labels", 2))


def sequence_loss(config, logits: Tensor, labels: Tensor) -> Tensor:
    """A sequence head's loss by config.extra's problem_type, or as transformers infers it:
    regression (MSE) for one output, cross-entropy for class ids, BCE for multi-label targets."""
    problem = config.extra.get("problem_type")
    if problem is None:  # transformers' rule
        if logits.shape[-1] == 1:
            problem = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem = "single_label_classification"
        else:
            problem = "multi_label_classification"
    if problem == "regression":
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).reshape(-1))
    if problem == "single_label_classification":
        return F.cross_entropy(logits, labels.reshape(-1))
    if problem == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    raise ValueError(f"config problem_type {problem!r} is not regression, single_label_classification "
                     "or multi_label_classification")


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor,
              cu_seqlens: Tensor | None, max_seqlen: int | None) -> Tensor:
    """The mean of the start and end cross-entropies, each sequence's logits ([B, T], or packed [N])
    scored against its own tokens."""
    if cu_seqlens is None:
        starts, ends, limit = start_logits, end_logits, start_logits.shape[1]
    else:  # packed: back to [B, T_max], padding at -inf so it is never an answer
        T = int(max_seqlen) if max_seqlen is not None else int(cu_seqlens.diff().max())
        starts = pad(start_logits, cu_seqlens, T, float("-inf"))
        ends = pad(end_logits, cu_seqlens, T, float("-inf"))
        limit = cu_seqlens.diff()  # [B]
    losses = [F.cross_entropy(logits, _clamp_ignored(pos, limit))
              for logits, pos in ((starts, start_positions), (ends, end_positions))]
    return (losses[0] + losses[1]) / 2


def _clamp_ignored(positions: Tensor, limit: Tensor | int) -> Tensor:
    """Positions at or past `limit` (per sequence or one number) become IGNORE."""
    positions = positions.reshape(-1).long()
    return torch.where((positions >= limit) | (positions < 0), torch.full_like(positions, IGNORE), positions)


def choice_block(scores: Tensor, num_choices: Tensor, max_choices: int | None = None) -> tuple[Tensor, Tensor]:
    """The packed choices' scores [S] -> [B, C] (0 at filler slots) and the mask of real ones [B, C],
    example b's choices in row b. C is max_choices, or read from num_choices (a host sync on a GPU);
    the scores are placed by index, whose backward (unlike a boolean mask's) reads nothing on the host."""
    B, S = num_choices.numel(), scores.numel()
    C = int(num_choices.max()) if max_choices is None else max_choices
    example = torch.arange(B, device=scores.device).repeat_interleave(num_choices, output_size=S)  # [S]
    first = num_choices.cumsum(0) - num_choices  # [B] where each example's choices start
    slot = example * C + torch.arange(S, device=scores.device) - first[example]  # [S] in the [B*C] block
    logits = scores.new_zeros(B * C).index_copy(0, slot, scores).view(B, C)
    mask = torch.arange(C, device=scores.device) < num_choices[:, None]  # [B, C]
    return logits, mask


def total(*losses: Tensor | None) -> Tensor | None:
    present = [x for x in losses if x is not None]
    return sum(present) if present else None


# -- language-model targets -------------------------------------------------------------------------

def next_tokens(input_ids: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
    """The target of each position: the token after it in its sequence, IGNORE at each sequence's
    last token. [B, T] -> [B, T]; packed [N] -> [N]."""
    targets = input_ids.roll(-1, dims=-1).clone()
    if cu_seqlens is None:
        targets[..., -1] = IGNORE
    else:
        targets[cu_seqlens[1:].long() - 1] = IGNORE
    return targets


def previous_tokens(input_ids: Tensor, cu_seqlens: Tensor) -> Tensor:
    """The backward LM's target at each packed position: the token before it, IGNORE at each first token."""
    targets = input_ids.roll(1).clone()
    targets[cu_seqlens[:-1].long()] = IGNORE
    return targets
