"""GPT: Improving Language Understanding by Generative Pre-Training (Radford et al., 2018), the
left-to-right Transformer that BERT is measured against.

    tokens -> token embedding + position embedding, dropout
           -> N x [ causal self-attention -> add & LayerNorm -> feed-forward (GELU) -> add & LayerNorm ]
           -> h_n;  P(next token) = softmax(h_n W_e^T): the output layer is the token embedding matrix

The blocks are BERT's (model.Layer: post-LN, a fused q/k/v projection, attention by name), with one
difference: a token attends to itself and the tokens before it only. There is no embedding
LayerNorm, no token types and no pooler. Inputs are [B, T] blocks of text (pretraining: every row
full, so no mask) or packed [N] with cu_seqlens (fine-tuning); either way padding could only ever
follow a token, so causal attention never sees it.

Class and parameter names follow Hugging Face's OpenAIGPTModel / OpenAIGPTLMHeadModel so that
config.json and model.safetensors are read and written in their layout (io/hf.py, GPT_KEYS).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import GPTConfig
from .heads import IGNORE, TaskOutput, num_labels, sequence_loss
from .io.hf import HFCheckpoint
from .model import BertOutput, Layer, check_ids, init_weights
from .packing import Layout, packed_layout


class Embeddings(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = nn.Embedding(config.n_positions, config.n_embd)
        self.dropout = nn.Dropout(config.embd_pdrop)

    def forward(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.dropout(self.tokens(input_ids) + self.positions(position_ids))  # [B, T, H] or [N, H]


class OpenAIGPTModel(HFCheckpoint, nn.Module):
    config_class = GPTConfig
    check_inputs = True  # as BertModel.check_inputs

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.block_config = config.blocks()  # the BertConfig of BERT's blocks at GPT's size
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(self.block_config) for _ in range(config.n_layer))
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None,
                max_seqlen: int | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BertOutput:
        """input_ids [B, T], or packed [N] with cu_seqlens [B + 1]. last_hidden_state [B, T, H] or [N, H]."""
        if cu_seqlens is None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be [batch, tokens] (or packed [N] with cu_seqlens), "
                                 f"got shape {tuple(input_ids.shape)}")
            B, T = input_ids.shape
            layout = Layout(B, T, None, causal=True)
            if position_ids is None:
                position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        else:
            if input_ids.dim() != 1:
                raise ValueError(f"packed input_ids must be 1-D [N], got shape {tuple(input_ids.shape)}")
            layout, offsets = packed_layout(cu_seqlens, max_seqlen, input_ids.numel(), causal=True)
            position_ids = offsets if position_ids is None else position_ids
        if self.check_inputs:
            check_ids(self.block_config, input_ids, torch.zeros_like(input_ids), position_ids)

        x = self.embeddings(input_ids, position_ids)
        hidden_states, attentions = [x], []
        for layer in self.layers:
            x, probs = layer(x, layout, need_weights=output_attentions)
            hidden_states.append(x)
            attentions.append(probs)
        return BertOutput(last_hidden_state=x,
                          hidden_states=tuple(hidden_states) if output_hidden_states else None,
                          attentions=tuple(attentions) if output_attentions else None)


@dataclass
class LMOutput:
    logits: Tensor  # [B, T, V] or [N, V]
    loss: Tensor | None = None  # mean next-token cross-entropy
    hidden_states: tuple[Tensor, ...] | None = None


def next_tokens(input_ids: Tensor, cu_seqlens: Tensor | None = None) -> Tensor:
    """The target of each position: the token after it in its sequence, IGNORE at each sequence's
    last token. [B, T] -> [B, T]; packed [N] -> [N]."""
    targets = input_ids.roll(-1, dims=-1).clone()
    if cu_seqlens is None:
        targets[..., -1] = IGNORE
    else:
        targets[cu_seqlens[1:].long() - 1] = IGNORE
    return targets


def lm_loss(model: OpenAIGPTModel, h: Tensor, input_ids: Tensor, cu_seqlens: Tensor | None) -> tuple[Tensor, Tensor]:
    """(logits [..., V] through the tied output layer, the mean next-token cross-entropy) of states h."""
    logits = h @ model.embeddings.tokens.weight.T  # [B, T, V] or [N, V]
    targets = next_tokens(input_ids, cu_seqlens)
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                                   ignore_index=IGNORE)


class OpenAIGPTLMHeadModel(HFCheckpoint, nn.Module):
    """GPT's pretraining objective (L1): maximize the log-likelihood of each token given those before it."""

    config_class = GPTConfig

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = OpenAIGPTModel(config)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None,
                max_seqlen: int | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False) -> LMOutput:
        """labels: the sequences themselves, as transformers takes them ([B, T] or [N], IGNORE where
        a token is not to be predicted); position t is scored against labels[t + 1] of its sequence."""
        out = self.transformer(input_ids, position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                               output_hidden_states=output_hidden_states)
        h = out.last_hidden_state
        if labels is None:
            return LMOutput(logits=h @ self.transformer.embeddings.tokens.weight.T, hidden_states=out.hidden_states)
        logits, loss = lm_loss(self.transformer, h, labels, cu_seqlens)
        return LMOutput(logits=logits, loss=loss, hidden_states=out.hidden_states)


class OpenAIGPTForSequenceClassification(HFCheckpoint, nn.Module):
    """The paper's classifier (section 3.3): the final state of each sequence's last token, its
    extract token ([SEP] in torchbert's encodings), through a linear layer. With labels the loss is
    L3 = L2 + lm_coef * L1: the task's loss plus the next-token loss on the task's own text, with
    lm_coef 0.5 as in the paper (config.extra["lm_coef"]). Hugging Face's layout: `score`, no bias."""

    config_class = GPTConfig

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = OpenAIGPTModel(config)
        self.score = nn.Linear(config.n_embd, num_labels(config), bias=False)
        init_weights(self.score, config.initializer_range)
        self.lm_coef = float(config.extra.get("lm_coef", 0.5))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        """As BertForSequenceClassification's, for packed [N] input or full [B, T] rows. GPT has no
        segments: token_type_ids are ignored (the delimiter token separates a pair), and
        attention_mask is refused (padding would be the last token)."""
        if attention_mask is not None:
            raise ValueError("GPT reads each sequence's last token: give it packed input (cu_seqlens), not padding")
        out = self.transformer(input_ids, position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        h = out.last_hidden_state
        last = h[:, -1] if cu_seqlens is None else h[cu_seqlens[1:].long() - 1]  # [B, H]: the extract tokens
        logits = self.score(last)  # [B, num_labels]
        loss = None
        if labels is not None:
            loss = sequence_loss(self.config, logits, labels)
            if self.lm_coef:
                loss = loss + self.lm_coef * lm_loss(self.transformer, h, input_ids, cu_seqlens)[1]
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)
