"""Task heads on top of BertModel, each with its loss, in one place.

Pretraining (BERT paper, section 3.1 and appendix A.1):
  * masked LM: dense + activation + LayerNorm, then a decoder that shares its weight with the word
    embeddings and has a bias of its own; cross-entropy on the masked positions only;
  * next sentence prediction: Linear(H, 2) on the pooled [CLS]; label 0 = B follows A (IsNext),
    1 = B is random (NotNext), the convention of Hugging Face's checkpoints;
  * the pretraining loss is the sum of the two means.

The MLM head gathers the hidden states of the masked positions before it runs: the vocabulary
projection [M, H] x [H, V] is the largest matrix product in a small BERT, and M is ~15% of the tokens.

Fine-tuning (section 4): a dropout and one linear layer on top, as in the paper and in `transformers`:
  * sequence classification: on the pooled [CLS]; cross-entropy, or MSE when num_labels == 1
    (regression), or BCE for problem_type "multi_label_classification";
  * token classification: on every token's final state; cross-entropy where the label is not -100;
  * extractive QA: Linear(H, 2) on every token, start and end logits; the loss is the mean of the start
    and end cross-entropies, gold positions outside the input clamped and ignored;
  * multiple choice: Linear(H, 1) on the pooled [CLS] of each (context, choice) pair, a softmax over choices.

Sentence embeddings (Sentence-BERT, Reimers and Gurevych 2019): each text through BERT alone, its
tokens pooled into one vector (mean, or [CLS]); trained with in-batch negatives (InfoNCE, van den Oord
et al. 2018; sentence-transformers' MultipleNegativesRankingLoss): each query scores every passage of
the batch by cosine similarity times a scale, and its own passage is the class to predict.

Inputs come padded ([B, T] with attention_mask; MLM labels as a [B, T] `labels` tensor with -100
where nothing is predicted, as in `transformers`) or packed ([N] with cu_seqlens; MLM targets as
`mlm_positions` [M] into the N tokens and `mlm_labels` [M]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .config import BertConfig
from .architectures import HFCheckpoint
from .io.hf import write_sentence_transformers
from .losses import IGNORE, TaskOutput, choice_block, num_labels, sequence_loss, span_loss, total
from .model import BertModel, BertOutput, activation, init_weights
from .packing import length_groups, pool_packed


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

    def forward(self, h: Tensor, word_embeddings: Tensor,
                targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """-> logits [M, V], and their mean cross-entropy against targets [M] (-100: not scored) when given."""
        h = self.norm(self.act(self.dense(h)))  # [M, H]
        logits = F.linear(h, word_embeddings, self.bias)  # [M, V]: the decoder, tied to the word embeddings
        return logits, None if targets is None else F.cross_entropy(logits, targets, ignore_index=IGNORE)


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
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                        output_positions=positions)
        mlm_logits, mlm_loss = self.mlm(out.last_hidden_state, self.bert.embeddings.word.weight, targets)  # [M, V]
        nsp_logits = self.nsp(out.pooler_output)  # [B, 2]
        nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label) if next_sentence_label is not None else None
        return PreTrainingOutput(total(mlm_loss, nsp_loss), mlm_loss, nsp_loss, mlm_logits, nsp_logits, targets,
                                 out.hidden_states, out.attentions)


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
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                        output_positions=positions)
        mlm_logits, mlm_loss = self.mlm(out.last_hidden_state, self.bert.embeddings.word.weight, targets)  # [M, V]
        return PreTrainingOutput(mlm_loss, mlm_loss, None, mlm_logits, None, targets,
                                 out.hidden_states, out.attentions)


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
        out: BertOutput = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                    position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                    output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        nsp_logits = self.nsp(out.pooler_output)  # [B, 2]
        nsp_loss = F.cross_entropy(nsp_logits, labels) if labels is not None else None
        return PreTrainingOutput(nsp_loss, None, nsp_loss, None, nsp_logits, None, out.hidden_states, out.attentions)


# -- fine-tuning heads ------------------------------------------------------------------------------

def classifier_dropout(config: BertConfig) -> nn.Dropout:
    p = config.extra.get("classifier_dropout")
    return nn.Dropout(config.hidden_dropout_prob if p is None else p)


class _TaskModel(HFCheckpoint, nn.Module):
    """BertModel (with its pooler or not, as in transformers) under a task head that the subclass
    defines; `classifier`: the head is dropout and a linear layer to that many outputs (transformers'
    `dropout` and `classifier`)."""

    def __init__(self, config: BertConfig, pooler: bool, classifier: int | None = None):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=pooler)
        if classifier is not None:
            self.dropout = classifier_dropout(config)
            self.classifier = nn.Linear(config.hidden_size, classifier)
            init_heads(self, (self.classifier,))

    def encode(self, input_ids: Tensor, *, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
               position_ids: Tensor | None = None, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
               output_hidden_states: bool = False, output_attentions: bool = False, cls_only: bool = False,
               positions: Tensor | None = None) -> BertOutput:
        """positions [K]: the flat token positions the head reads besides [CLS] (cls_only: none).
        The last layer then runs for those tokens and [CLS] alone, and last_hidden_state is [K, H].
        When every layer's states or attentions are asked for, it runs in full and the rows are
        picked afterwards."""
        if cls_only:
            positions = torch.empty(0, dtype=torch.long, device=input_ids.device)
        full = output_hidden_states or output_attentions
        out = self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                        output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                        output_positions=None if full else positions)
        if full and positions is not None:
            out.last_hidden_state = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[positions]
        return out


class BertForSequenceClassification(_TaskModel):
    def __init__(self, config: BertConfig):
        super().__init__(config, pooler=True, classifier=num_labels(config))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        out = self.encode(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions, cls_only=True)
        logits = self.classifier(self.dropout(out.pooler_output))  # [B, num_labels]
        loss = None if labels is None else sequence_loss(self.config, logits, labels)
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)


class BertForReranking(BertForSequenceClassification):
    """A cross-encoder: BertForSequenceClassification with one output, the score of a (query, passage)
    pair, and saved as that class (transformers and sentence-transformers' CrossEncoder load it; its
    relevance is the sigmoid of the score). With num_choices [U] (each query's candidate pairs in a
    row) and labels [S] (each pair's relevance, 0 to 1), the loss `loss` (a training setting, not
    the model's: finetune --rerank-loss):
    listwise, the cross-entropy of the softmax over a query's candidates against its labels (scaled
    to sum to 1); pointwise, the binary cross-entropy of each pair."""

    hf_architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig, loss: str = "listwise"):
        super().__init__(config)
        self.loss_kind = loss
        if self.loss_kind not in ("listwise", "pointwise") or num_labels(config) != 1:
            raise ValueError(f"a reranker has one output and a listwise or pointwise loss, got {num_labels(config)} "
                             f"and {self.loss_kind!r}")

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                num_choices: Tensor | None = None, max_choices: int | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> TaskOutput:
        """logits: [S] a score per pair; with num_choices, [U, C] each query's in a row (filler slots at
        the dtype's lowest value)."""
        out = self.encode(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions, cls_only=True)
        scores = self.classifier(self.dropout(out.pooler_output)).squeeze(-1)  # [S]
        logits, loss = scores, None
        if num_choices is not None:
            block, mask = choice_block(scores, num_choices, max_choices)  # [U, C]
            logits = block.masked_fill(~mask, torch.finfo(block.dtype).min)
        if labels is not None and self.loss_kind == "pointwise":
            loss = F.binary_cross_entropy_with_logits(scores.float(), labels.float())
        elif labels is not None:
            if num_choices is None:
                raise ValueError("a listwise loss needs num_choices: the candidates of each query")
            target = choice_block(labels.float(), num_choices, max_choices)[0]
            target = target / target.sum(-1, keepdim=True)
            loss = -(target * logits.float().log_softmax(-1)).sum(-1).mean()
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)


class BertForTokenClassification(_TaskModel):
    def __init__(self, config: BertConfig):
        super().__init__(config, pooler=False, classifier=num_labels(config))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, labelled_only: bool = False,
                label_positions: Tensor | None = None) -> TaskOutput:
        """labelled_only (with labels): logits [M, num_labels] for the M labelled tokens only (labels
        != -100, in flat order), and the last layer runs for those tokens alone, as the MLM head's
        does for the masked ones; the loss is the same. Training takes this path: a word's later
        sub-tokens, [CLS] and [SEP] carry no label, about a third of the tokens of English tweets.
        label_positions [M]: those tokens' flat positions, when the caller knows them (found from
        the labels otherwise, a host sync on a GPU)."""
        positions = None
        if labelled_only and labels is not None:
            positions = label_positions
            if positions is None:
                positions = (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)  # [M]
            labels = labels.reshape(-1)[positions]
        out = self.encode(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                          positions=positions)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # [B, T, C], [N, C] or labelled [M, C]
        loss = None
        if labels is not None:  # -100 marks tokens without a label (padding, later sub-tokens)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)


class BertForQuestionAnswering(_TaskModel):
    def __init__(self, config: BertConfig):
        super().__init__(config, pooler=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # start, end; no dropout before it, as in transformers
        init_heads(self, (self.qa_outputs,))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                start_positions: Tensor | None = None, end_positions: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> TaskOutput:
        """start/end_positions [B]: token positions in each sequence. Positions past the sequence are
        clamped to its length and ignored, as in transformers (which, padded, ignores those >= T).
        Packed, the logits of each sequence are scored against its own tokens only."""
        out = self.encode(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                          output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).unbind(-1)  # each [B, T] or [N]
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions, cu_seqlens, max_seqlen)
        return TaskOutput(loss, None, start_logits, end_logits, out.hidden_states, out.attentions)


class BertForMultipleChoice(_TaskModel):
    def __init__(self, config: BertConfig):
        super().__init__(config, pooler=True, classifier=1)  # one score per (context, choice) pair

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                num_choices: Tensor | None = None, choice_mask: Tensor | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                max_choices: int | None = None) -> TaskOutput:
        """Padded: input_ids [B, C, T] (C choices each), with choice_mask [B, C] (False where an example
        has fewer choices and the row is filler). Packed: input_ids [N] holding every real choice of
        every example in order, cu_seqlens over those sequences, and num_choices [B] (max_choices,
        their most, when the caller knows it: read from num_choices otherwise, a host sync on a GPU)."""
        if cu_seqlens is None:
            if input_ids.dim() != 3:
                raise ValueError(f"input_ids must be [batch, choices, tokens], got shape {tuple(input_ids.shape)}")
            B, C, T = input_ids.shape
            mask_, types, positions = (None if t is None else t.reshape(B * C, T)
                                       for t in (attention_mask, token_type_ids, position_ids))
            out = self.encode(input_ids.reshape(B * C, T), attention_mask=mask_, token_type_ids=types,
                              position_ids=positions, output_hidden_states=output_hidden_states,
                              output_attentions=output_attentions, cls_only=True)
            logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # [B, C]
            mask = choice_mask
        else:
            if num_choices is None:
                raise ValueError("packed multiple-choice inputs need num_choices [batch]")
            out = self.encode(input_ids, token_type_ids=token_type_ids, position_ids=position_ids,
                              cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                              output_attentions=output_attentions, cls_only=True)
            scores = self.classifier(self.dropout(out.pooler_output)).squeeze(-1)  # [sum C_i]
            logits, mask = choice_block(scores, num_choices, max_choices)
        if mask is not None:
            logits = logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)
        loss = None if labels is None else F.cross_entropy(logits, labels.reshape(-1))
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)


@dataclass
class EmbeddingOutput:
    loss: Tensor | None = None  # InfoNCE over the batch: mean over its queries
    embeddings: Tensor | None = None  # [S, H] one per sequence, pooled (not normalized)
    scores: Tensor | None = None  # [U, D] each query's scaled cosine with every passage of the batch
    targets: Tensor | None = None  # [U] the column of each query's own passage in scores
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


TEMPERATURE = 0.05  # of the softmax over cosine similarities: sentence-transformers' scale 20
MAX_SCALE = 100.0  # a learned temperature stops at 0.01 (CLIP's clamp of its logit scale)


class BertForEmbedding(_TaskModel):
    """BertModel without its pooler; the token states pooled by config.extra["pooling"] (mean, the
    default; or cls). With num_choices [U] (packed rows grouped per example: its query, then its
    positive passage, then any hard negatives) the loss of in-batch negatives, at `temperature`
    (learned from there with `learn_temperature`), summed over the full vectors and their first D
    dimensions for each D of config.extra["matryoshka"] (Matryoshka representation learning,
    Kusupati et al. 2022: sentence-transformers' MatryoshkaLoss, weights 1). The temperature and
    `mini_batch` are how it trains, given by fine-tuning (finetune's flags), not kept in config.json."""

    def __init__(self, config: BertConfig, temperature: float = TEMPERATURE, learn_temperature: bool = False,
                 mini_batch: int | None = None):
        super().__init__(config, pooler=False)
        extra = config.extra
        self.pooling = extra.get("pooling", "mean")
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be mean or cls, got {self.pooling!r}")
        self.dims = sorted({int(d) for d in extra.get("matryoshka") or ()}, reverse=True)
        if any(not 1 <= d < config.hidden_size for d in self.dims):
            raise ValueError(f"matryoshka dimensions must be from 1 to {config.hidden_size - 1} (the model's vectors "
                             f"have {config.hidden_size}), got {self.dims}")
        self.mini_batch = mini_batch  # texts encoded at a time in training, activations recomputed
        scale = math.log(1.0 / temperature)
        if learn_temperature:
            self.logit_scale = nn.Parameter(torch.tensor(scale))  # log(1 / temperature), as CLIP
        else:
            self.register_buffer("logit_scale", torch.tensor(scale), persistent=False)

    def _grouped(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None,
                 cu_seqlens: Tensor) -> Tensor:
        """The pooled vectors [S, H] of packed sequences, encoded a group of similar lengths at a time;
        with mini_batch, in training, at most that many at a time, each chunk under activation
        checkpointing: its activations are recomputed in the backward from its inputs, so that the
        batch's memory is the vectors and one chunk's activations (GradCache's, Gao et al. 2021,
        whose two passes this is: the gradients are the same as one pass's; the dropout masks are
        drawn again from the same saved random state)."""
        lengths = cu_seqlens.diff().tolist()
        starts = cu_seqlens[:-1].tolist()
        chunk = self.mini_batch if self.training and torch.is_grad_enabled() and self.mini_batch else None
        groups = [g[i:i + chunk] for g in length_groups(lengths) for i in range(0, len(g), chunk)] if chunk else \
            length_groups(lengths)
        parts, order = [], []
        for group in groups:
            rows = torch.cat([torch.arange(starts[s], starts[s] + lengths[s], device=input_ids.device) for s in group])
            sub = F.pad(torch.tensor([lengths[s] for s in group], device=cu_seqlens.device).cumsum(0), (1, 0))
            inputs = (input_ids[rows], None if token_type_ids is None else token_type_ids[rows],
                      None if position_ids is None else position_ids[rows], sub.to(cu_seqlens.dtype),
                      max(lengths[s] for s in group))
            parts.append(checkpoint(self._pooled, *inputs, use_reentrant=False) if chunk else self._pooled(*inputs))
            order += group
        back = torch.empty(len(order), dtype=torch.long, device=input_ids.device)
        back[torch.tensor(order, device=input_ids.device)] = torch.arange(len(order), device=input_ids.device)
        return torch.cat(parts)[back]  # in the batch's order

    def _pooled(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor | None,
                cu_seqlens: Tensor, max_seqlen: int) -> Tensor:
        h = self.encode(input_ids, token_type_ids=token_type_ids, position_ids=position_ids, cu_seqlens=cu_seqlens,
                        max_seqlen=max_seqlen).last_hidden_state
        return pool_packed(h, cu_seqlens, self.pooling)

    def save_pretrained(self, path) -> None:
        """A BERT checkpoint that is a sentence-transformers model too (modules.json, its pooling, and the
        tokens per text it was trained with: config.extra's max_seq_length, else its positions)."""
        super().save_pretrained(path)
        length = min(self.config.extra.get("max_seq_length") or self.config.max_position_embeddings,
                     self.config.max_position_embeddings)
        write_sentence_transformers(path, self.config.hidden_size, self.pooling, length)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                num_choices: Tensor | None = None, max_choices: int | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> EmbeddingOutput:
        """Packed rows ([N] with cu_seqlens) or padded ([B, T] with attention_mask) -> one embedding each.
        Packed rows run in groups of similar length (packing.length_groups), as each text is encoded
        alone: the queries' attention is not padded to the passages' length."""
        if cu_seqlens is not None and not (output_hidden_states or output_attentions):
            emb = self._grouped(input_ids, token_type_ids, position_ids, cu_seqlens)  # [S, H]
            out = None
        else:
            out = self.encode(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions)
            h = out.last_hidden_state
            if cu_seqlens is None:  # padded [B, T, H]: the real tokens only
                mask = torch.ones(h.shape[:2], device=h.device) if attention_mask is None else attention_mask
                mask = mask.to(h.dtype).unsqueeze(-1)
                emb = h[:, 0] if self.pooling == "cls" else (h * mask).sum(1) / mask.sum(1).clamp(min=1)
            else:
                emb = pool_packed(h, cu_seqlens, self.pooling)  # [S, H]
        result = EmbeddingOutput(embeddings=emb, hidden_states=out and out.hidden_states,
                                 attentions=out and out.attentions)
        if num_choices is not None:
            starts = torch.cumsum(num_choices, 0) - num_choices  # [U] each example's query row
            is_query = torch.zeros(len(emb), dtype=torch.bool, device=emb.device)
            is_query[starts] = True
            targets = starts - torch.arange(len(starts), device=emb.device)  # its positive, with the queries out
            scale = self.logit_scale.exp().clamp(max=MAX_SCALE)
            losses = []
            for d in (emb.shape[-1], *self.dims):
                unit = F.normalize(emb[:, :d].float(), dim=-1)
                scores = scale * unit[is_query] @ unit[~is_query].T  # [U, D]
                losses.append(F.cross_entropy(scores, targets))
                if d == emb.shape[-1]:
                    result.scores, result.targets = scores, targets
            result.loss = sum(losses)
        return result


# -- shared pieces ---------------------------------------------------------------------------------

def init_heads(model: nn.Module, heads: tuple[nn.Module, ...]) -> None:
    for head in heads:
        head.apply(partial(init_weights, std=model.config.initializer_range))
