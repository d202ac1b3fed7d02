"""Task heads on top of BertModel, each with its loss, in one place.

Pretraining (BERT paper, section 3.1 and appendix A.1):
  * masked LM: dense + activation + LayerNorm, then a decoder that shares its weight with the word
    embeddings and has a bias of its own; cross-entropy on the masked positions only;
  * next sentence prediction: Linear(H, 2) on the pooled [CLS]; label 0 = B follows A (IsNext),
    1 = B is random (NotNext), the convention of Hugging Face's checkpoints;
  * the pretraining loss is the sum of the two means.

The MLM head gathers the hidden states of the masked positions before it runs: the vocabulary
projection [M, H] x [H, V] is the largest matrix product in a small BERT, and M is ~15% of the tokens.

Inputs come padded ([B, T] with attention_mask; MLM labels as a [B, T] `labels` tensor with -100
where nothing is predicted, as in `transformers`) or packed ([N] with cu_seqlens; MLM targets as
`mlm_positions` [M] into the N tokens and `mlm_labels` [M]).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from .io.hf import HFCheckpoint, bert_key_map
from .model import BertModel, BertOutput, activation, init_weights

IGNORE = -100  # label of positions that carry no MLM target


@dataclass
class PreTrainingOutput:
    loss: Tensor | None = None  # mlm_loss + nsp_loss (those that were asked for)
    mlm_loss: Tensor | None = None  # mean over the masked tokens
    nsp_loss: Tensor | None = None  # mean over the batch
    mlm_logits: Tensor | None = None  # [M, V] at the masked positions; [B, T, V] or [N, V] without targets
    nsp_logits: Tensor | None = None  # [B, 2]
    mlm_labels: Tensor | None = None  # [M] the targets mlm_logits are scored against
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


class MaskedLMHead(nn.Module):
    """The decoder weight is the word embedding matrix [V, H], passed in by the model (tied)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        h = self.norm(self.act(self.dense(h)))  # [M, H]
        return F.linear(h, word_embeddings, self.bias)  # [M, V]


def mlm_targets(labels: Tensor | None, mlm_positions: Tensor | None,
                mlm_labels: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """The flat positions to score [M] (into the [B*T] or [N] tokens) and their labels [M]; both None
    when there are no targets (then every token is scored)."""
    if labels is not None:  # padded, transformers-style
        flat = labels.reshape(-1)
        mlm_positions = (flat != IGNORE).nonzero().squeeze(1)  # [M]
        mlm_labels = flat[mlm_positions]
    return mlm_positions, mlm_labels


class BertForPreTraining(HFCheckpoint, nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        init_heads(self, (self.mlm, self.nsp))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, next_sentence_label: Tensor | None = None,
                mlm_positions: Tensor | None = None, mlm_labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> PreTrainingOutput:
        positions, targets = mlm_targets(labels, mlm_positions, mlm_labels)
        # the last layer runs only at the masked positions (and [CLS]): h is [M, H]
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, cu_seqlens=cu_seqlens,
                        max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions, output_positions=positions)
        mlm_logits = self.mlm(out.last_hidden_state, self.bert.embeddings.word.weight)  # [M, V]
        nsp_logits = self.nsp(out.pooler_output)  # [B, 2]
        mlm_loss = F.cross_entropy(mlm_logits, targets) if targets is not None else None
        nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label) if next_sentence_label is not None else None
        return PreTrainingOutput(total(mlm_loss, nsp_loss), mlm_loss, nsp_loss, mlm_logits, nsp_logits, targets,
                                 out.hidden_states, out.attentions)

    def hf_key_map(self) -> dict[str, tuple[str, ...]]:
        return {**backbone_map(self.config, pooler=True), **MLM_KEYS, **NSP_KEYS}


class BertForMaskedLM(HFCheckpoint, nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)  # as in transformers: MLM needs no pooler
        self.mlm = MaskedLMHead(config)
        init_heads(self, (self.mlm,))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, mlm_positions: Tensor | None = None, mlm_labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> PreTrainingOutput:
        positions, targets = mlm_targets(labels, mlm_positions, mlm_labels)
        # the last layer runs only at the masked positions (and [CLS]): h is [M, H]
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, cu_seqlens=cu_seqlens,
                        max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                        output_attentions=output_attentions, output_positions=positions)
        mlm_logits = self.mlm(out.last_hidden_state, self.bert.embeddings.word.weight)
        mlm_loss = F.cross_entropy(mlm_logits, targets) if targets is not None else None
        return PreTrainingOutput(mlm_loss, mlm_loss, None, mlm_logits, None, targets,
                                 out.hidden_states, out.attentions)

    def hf_key_map(self) -> dict[str, tuple[str, ...]]:
        return {**backbone_map(self.config, pooler=False), **MLM_KEYS}


class BertForNextSentencePrediction(HFCheckpoint, nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        init_heads(self, (self.nsp,))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> PreTrainingOutput:
        out: BertOutput = self.bert(input_ids, attention_mask, token_type_ids, position_ids, cu_seqlens=cu_seqlens,
                                    max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                                    output_attentions=output_attentions)
        nsp_logits = self.nsp(out.pooler_output)  # [B, 2]
        nsp_loss = F.cross_entropy(nsp_logits, labels) if labels is not None else None
        return PreTrainingOutput(nsp_loss, None, nsp_loss, None, nsp_logits, None, out.hidden_states, out.attentions)

    def hf_key_map(self) -> dict[str, tuple[str, ...]]:
        return {**backbone_map(self.config, pooler=True), **NSP_KEYS}


# -- shared pieces ---------------------------------------------------------------------------------

def total(*losses: Tensor | None) -> Tensor | None:
    present = [x for x in losses if x is not None]
    return sum(present) if present else None


def init_heads(model: nn.Module, heads: tuple[nn.Module, ...]) -> None:
    for head in heads:
        head.apply(partial(init_weights, std=model.config.initializer_range))


def backbone_map(config: BertConfig, pooler: bool) -> dict[str, tuple[str, ...]]:
    """BertModel's key map under the `bert.` prefix that task models use on both sides."""
    return {f"bert.{k}": tuple(f"bert.{h}" for h in hs) for k, hs in bert_key_map(config, pooler).items()}


# Hugging Face's cls.predictions.decoder.{weight,bias} are the tied word embeddings and
# cls.predictions.bias again; io/hf.py drops them on load and they are not written.
MLM_KEYS = {
    "mlm.dense.weight": ("cls.predictions.transform.dense.weight",),
    "mlm.dense.bias": ("cls.predictions.transform.dense.bias",),
    "mlm.norm.weight": ("cls.predictions.transform.LayerNorm.weight",),
    "mlm.norm.bias": ("cls.predictions.transform.LayerNorm.bias",),
    "mlm.bias": ("cls.predictions.bias",),
}
NSP_KEYS = {
    "nsp.weight": ("cls.seq_relationship.weight",),
    "nsp.bias": ("cls.seq_relationship.bias",),
}
