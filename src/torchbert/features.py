"""Feature extraction: BERT's hidden states as fixed features (BERT paper, section 5.3).

Per-token features come from one layer or a combination of layers, the strategies of the paper's
feature-based NER table (Table 7):

    embeddings        the embedding layer output (hidden_states[0])
    last              the last hidden layer
    second_to_last    the second-to-last hidden layer
    sum_all           the sum of all N encoder layers (the embedding output excluded)
    sum_last_four     the sum of the last four layers
    concat_last_four  the last four layers side by side: [.., 4H]

or an integer layer index (0 = embeddings, N = last, negative counts from the end).
Per-word features pool sub-tokens (first sub-token or their mean); sentence embeddings pool tokens
([CLS], the mean over real tokens, or the max).

`embed` is the fast batch path: tokenize everything at once (Rust), sort by length, run the unpadded
model on packed batches, pool each sequence with segment sums, and return rows in input order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .config import check_ids
from .fast import threads
from .packing import POOLINGS, pack, pool_packed

STRATEGIES = ("embeddings", "last", "second_to_last", "sum_all", "sum_last_four", "concat_last_four")


def parse_strategy(strategy: str | int) -> str | int:
    """A strategy name, or a layer index given as an int or a string like "-2"."""
    if isinstance(strategy, int):
        return strategy
    if strategy in STRATEGIES:
        return strategy
    try:
        return int(strategy)
    except ValueError:
        raise ValueError(f"unknown layer strategy {strategy!r}; use one of {', '.join(STRATEGIES)} "
                         "or a layer index (0 = embeddings, -1 = last)") from None


def needs_all_layers(strategy: str | int) -> bool:
    return parse_strategy(strategy) != "last"


def check_strategy(strategy: str | int, n: int) -> str | int:
    """The strategy, checked against a model of n encoder layers (before any text is read)."""
    strategy = parse_strategy(strategy)
    if isinstance(strategy, int) and not -(n + 1) <= strategy <= n:
        raise ValueError(f"layer {strategy} out of range for a model with {n} layers (0..{n})")
    if strategy in ("sum_last_four", "concat_last_four") and n < 4:
        raise ValueError(f"{strategy} needs at least 4 layers; this model has {n}")
    return strategy


def combine_layers(hidden_states: Sequence[Tensor], strategy: str | int = "last") -> Tensor:
    """hidden_states: the N+1 outputs (embeddings, then each layer), each [..., H]."""
    hs = hidden_states
    strategy = check_strategy(strategy, len(hs) - 1)
    if isinstance(strategy, int):
        return hs[strategy]
    if strategy == "embeddings":
        return hs[0]
    if strategy == "last":
        return hs[-1]
    if strategy == "second_to_last":
        return hs[-2]
    if strategy == "sum_all":
        return torch.stack(hs[1:]).sum(0)
    if strategy == "sum_last_four":
        return torch.stack(hs[-4:]).sum(0)
    return torch.cat(hs[-4:], dim=-1)  # concat_last_four: [..., 4H]


def token_features(model, input_ids: Tensor, attention_mask: Tensor | None = None,
                   token_type_ids: Tensor | None = None, strategy: str | int = "last") -> Tensor:
    """Per-token features [B, T, F] of a padded batch (F = H, or 4H for concat_last_four)."""
    out = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                output_hidden_states=needs_all_layers(strategy))
    if not needs_all_layers(strategy):
        return out.last_hidden_state
    return combine_layers(out.hidden_states, strategy)


def word_features(features: Tensor, word_ids: Sequence[int | None], mode: str = "first") -> Tensor:
    """Token features [T, F] of one sequence -> one row per word [W, F].

    word_ids: the tokenizer's word index of each token (None for [CLS], [SEP], padding).
    mode: "first" takes the word's first sub-token (as the paper's NER does), "mean" averages them."""
    if mode not in ("first", "mean"):
        raise ValueError(f"word pooling must be 'first' or 'mean', got {mode!r}")
    words = [w for w in word_ids if w is not None]
    n_words = max(words) + 1 if words else 0
    keep = [i for i, w in enumerate(word_ids) if w is not None]
    ids = torch.tensor([word_ids[i] for i in keep], device=features.device, dtype=torch.long)
    rows = features[keep]  # [T', F] real tokens
    if mode == "first":
        first = torch.full((n_words,), -1, dtype=torch.long, device=features.device)
        # scatter in reverse so that the lowest token index of each word wins
        first[ids.flip(0)] = torch.arange(len(keep) - 1, -1, -1, device=features.device)
        return rows[first]
    sums = features.new_zeros(n_words, features.shape[-1]).index_add_(0, ids, rows)
    counts = torch.bincount(ids, minlength=n_words).clamp_min(1).to(features.dtype)
    return sums / counts[:, None]


def pool(features: Tensor, attention_mask: Tensor, pooling: str = "mean") -> Tensor:
    """Padded token features [B, T, F] -> sentence embeddings [B, F]."""
    if pooling == "cls":
        return features[:, 0]
    mask = attention_mask.to(features.dtype).unsqueeze(-1)  # [B, T, 1]
    if pooling == "mean":
        return (features * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    if pooling == "max":
        return features.masked_fill(mask == 0, torch.finfo(features.dtype).min).amax(1)
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices grouped into batches of similar length (longest first), so little is padded in attention."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def embed(model, tokenizer, texts: Sequence[str], *, pooling: str = "mean", layers: str | int = "last",
          normalize: bool = False, batch_size: int = 64, max_length: int | None = None,
          progress: bool = False) -> np.ndarray:
    """Sentence embeddings [len(texts), F] as float32 numpy, rows in input order.

    Sequences longer than max_length (default: the model's max_position_embeddings) are truncated."""
    limit = model.config.max_position_embeddings
    max_length = min(max_length or limit, limit)
    ids = tokenizer.encode_ids(list(texts), max_length=max_length, truncation=True)
    return embed_ids(model, ids, pooling=pooling, layers=layers, normalize=normalize, batch_size=batch_size,
                     progress=progress)


@torch.inference_mode()
def embed_ids(model, ids: Sequence[Sequence[int]], *, pooling: str = "mean", layers: str | int = "last",
              normalize: bool = False, batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """`embed` on token ids (each with its [CLS] and [SEP]): [len(ids), F] float32, rows in input order."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    strategy = parse_strategy(layers)
    device = next(itertools.chain(model.parameters(), model.buffers())).device  # an INT8 encoder has buffers only
    dim = model.config.hidden_size * (4 if strategy == "concat_last_four" else 1)
    out = np.empty((len(ids), dim), dtype=np.float32)
    batches = length_sorted_batches([len(x) for x in ids], batch_size)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(ids), unit="text", desc="embed")
    with threads.busy():  # this job computes: the other torchbert jobs count it (fast/threads.py)
        for idx in batches:
            threads.tick()  # this job's share of the CPUs, when a command governs them
            flat, cu, longest = pack([ids[i] for i in idx])
            check_ids(model.config, flat, None, longest)
            flat, cu = flat.to(device), cu.to(device)
            o = model(flat, cu_seqlens=cu, max_seqlen=longest,
                      output_hidden_states=needs_all_layers(strategy))
            feats = o.last_hidden_state if not needs_all_layers(strategy) else combine_layers(o.hidden_states,
                                                                                              strategy)
            e = pool_packed(feats, cu, pooling)
            if normalize:
                e = F.normalize(e, dim=-1)
            out[idx] = e.float().cpu().numpy()
            if bar is not None:
                bar.update(len(idx))
    if bar is not None:
        bar.close()
    return out
