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

from ..config import GPTConfig
from ..architectures import HFCheckpoint
from ..losses import IGNORE, TaskOutput, choice_block, next_tokens, num_labels, sequence_loss, span_loss
from ..model import Layer, init_weights
from ..packing import Layout, packed_layout


class Embeddings(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = nn.Embedding(config.n_positions, config.n_embd)
        self.dropout = nn.Dropout(config.embd_pdrop)

    def forward(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.dropout(self.tokens(input_ids) + self.positions(position_ids))  # [B, T, H] or [N, H]


@dataclass
class GPTOutput:
    last_hidden_state: Tensor  # [B, T, H] full rows, [N, H] packed
    hidden_states: tuple[Tensor, ...] | None = None  # n_layer + 1 of them: embeddings, then each block
    attentions: tuple[Tensor, ...] | None = None  # each [B, A, T, T]


class OpenAIGPTModel(HFCheckpoint, nn.Module):
    config_class = GPTConfig

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.block_config = config.blocks()  # the BertConfig of BERT's blocks at GPT's size
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(self.block_config) for _ in range(config.n_layer))
        self.apply(partial(init_weights, std=config.initializer_range))

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None,
                max_seqlen: int | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> GPTOutput:
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

        x = self.embeddings(input_ids, position_ids)
        hidden_states, attentions = [x], []
        for layer in self.layers:
            x, probs = layer(x, layout, need_weights=output_attentions)
            hidden_states.append(x)
            attentions.append(probs)
        return GPTOutput(last_hidden_state=x,
                         hidden_states=tuple(hidden_states) if output_hidden_states else None,
                         attentions=tuple(attentions) if output_attentions else None)


@dataclass
class LMOutput:
    logits: Tensor  # [B, T, V] or [N, V]
    loss: Tensor | None = None  # mean next-token cross-entropy
    hidden_states: tuple[Tensor, ...] | None = None


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


LM_COEF = 0.5  # the weight of the next-token loss in fine-tuning (the paper's)


class _GPTTask(HFCheckpoint, nn.Module):
    """GPT under a task head (section 3.3). With targets the loss is L3 = L2 + lm_coef * L1: the task's
    loss plus the next-token loss on the task's own text, lm_coef 0.5 as in the paper (a training
    setting, `finetune --lm-coef`, not kept in config.json). Inputs are packed [N] with cu_seqlens,
    or full [B, T] rows; GPT has no segments, so token_type_ids are ignored (the delimiter token separates a
    pair) and attention_mask is refused (padding would follow each sequence's last token)."""

    config_class = GPTConfig

    def __init__(self, config: GPTConfig, lm_coef: float = LM_COEF):
        super().__init__()
        self.config = config
        self.transformer = OpenAIGPTModel(config)
        self.lm_coef = float(lm_coef)

    def encode(self, input_ids: Tensor, *, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
               cu_seqlens: Tensor | None = None, max_seqlen: int | None = None, output_hidden_states: bool = False,
               output_attentions: bool = False) -> GPTOutput:
        if attention_mask is not None:
            raise ValueError("GPT reads each sequence's last token: give it packed input (cu_seqlens), not padding")
        return self.transformer(input_ids, position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                                output_hidden_states=output_hidden_states, output_attentions=output_attentions)

    def with_lm(self, task_loss: Tensor, h: Tensor, input_ids: Tensor, cu_seqlens: Tensor | None) -> Tensor:
        """L3 = L2 + lm_coef * L1."""
        if not self.lm_coef:
            return task_loss
        return task_loss + self.lm_coef * lm_loss(self.transformer, h, input_ids, cu_seqlens)[1]


def last_tokens(h: Tensor, cu_seqlens: Tensor | None) -> Tensor:
    """[B, H]: the final state of each sequence's last token (the extract token, [SEP] in torchbert's encodings)."""
    return h[:, -1] if cu_seqlens is None else h[cu_seqlens[1:].long() - 1]


def both_orders(input_ids: Tensor, token_type_ids: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Packed pairs `[CLS] a [SEP] b [SEP]` -> the same pairs as `[CLS] b [SEP] a [SEP]`, [N] -> [N]
    (the paper's similarity input: the two sentences have no inherent order). A sequence with one
    segment is its own reverse."""
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens.diff().long()
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=input_ids.device), lengths)  # [N]
    o = torch.arange(input_ids.numel(), device=input_ids.device) - starts[seq]  # offset in the sequence
    L = lengths[seq]
    first = torch.zeros_like(lengths).index_add_(0, seq, (token_type_ids == 0).long())[seq]  # [CLS] a [SEP]
    b = L - first  # b [SEP]
    source = torch.where(o == 0, 0,
             torch.where(o < b, first + o - 1,  # b, after [CLS]
             torch.where(o == b, first - 1,  # the middle [SEP]
             torch.where(o < L - 1, o - b, L - 1))))  # a, then the last [SEP]
    source = torch.where(b > 0, source, o)
    return input_ids[starts[seq] + source]


class OpenAIGPTForSequenceClassification(_GPTTask):
    """The paper's classifier: the extract token's final state through a linear layer (Hugging
    Face's `score`, no bias). Similarity (config.both_orders, set for regression tasks):
    each pair is read in both orders and the two final states are summed before the layer."""

    def __init__(self, config: GPTConfig, lm_coef: float = LM_COEF):
        super().__init__(config, lm_coef)
        self.score = nn.Linear(config.n_embd, num_labels(config), bias=False)
        init_weights(self.score, config.initializer_range)
        self.both_orders = bool(config.both_orders)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaskOutput:
        if self.both_orders:
            if token_type_ids is None:
                raise ValueError("similarity reads each pair in both orders: it needs token_type_ids")
            if cu_seqlens is None:  # full [B, T] rows -> packed
                B, T = input_ids.shape
                cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=input_ids.device)
                input_ids, token_type_ids, max_seqlen = input_ids.reshape(-1), token_type_ids.reshape(-1), T
            n = input_ids.numel()
            input_ids = torch.cat([input_ids, both_orders(input_ids, token_type_ids, cu_seqlens)])  # [2N]
            cu_seqlens = torch.cat([cu_seqlens, cu_seqlens[1:] + n])  # [2B + 1]
        out = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids, cu_seqlens=cu_seqlens,
                          max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                          output_attentions=output_attentions)
        h = out.last_hidden_state
        last = last_tokens(h, cu_seqlens)  # [B, H] ([2B, H] in both orders)
        if self.both_orders:
            last = sum(last.chunk(2))  # [B, H]: the two orders' final states summed
        logits = self.score(last)  # [B, num_labels]
        loss = None
        if labels is not None:
            loss = self.with_lm(sequence_loss(self.config, logits, labels), h, input_ids, cu_seqlens)
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)


class OpenAIGPTForTokenClassification(_GPTTask):
    """A tag from each token's final state, which has seen the tokens before it only: the
    left-to-right baseline of BERT's tagging (Hugging Face has no such class; the head is named
    as BERT's, `classifier`)."""

    def __init__(self, config: GPTConfig, lm_coef: float = LM_COEF):
        super().__init__(config, lm_coef)
        self.dropout = nn.Dropout(config.resid_pdrop)
        self.classifier = nn.Linear(config.n_embd, num_labels(config))
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, labelled_only: bool = False,
                label_positions: Tensor | None = None) -> TaskOutput:
        """As BertForTokenClassification's; labelled_only: logits [M, C] for the labelled tokens only
        (at label_positions [M] when given)."""
        out = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids, cu_seqlens=cu_seqlens,
                          max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                          output_attentions=output_attentions)
        h = out.last_hidden_state  # [B, T, H] or [N, H]
        read, targets = h, labels
        if labelled_only and labels is not None:
            positions = label_positions
            if positions is None:
                positions = (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)  # [M]
            read, targets = h.reshape(-1, h.shape[-1])[positions], labels.reshape(-1)[positions]
        logits = self.classifier(self.dropout(read))  # [B, T, C], [N, C] or [M, C]
        loss = None
        if labels is not None:
            task = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)
            loss = self.with_lm(task, h, input_ids, cu_seqlens)
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)


class OpenAIGPTForQuestionAnswering(_GPTTask):
    """Start and end logits from each token's final state (`qa_outputs`, as BERT's): the question
    comes first, so every context token has read it."""

    def __init__(self, config: GPTConfig, lm_coef: float = LM_COEF):
        super().__init__(config, lm_coef)
        self.qa_outputs = nn.Linear(config.n_embd, 2)
        init_weights(self.qa_outputs, config.initializer_range)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                start_positions: Tensor | None = None, end_positions: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False) -> TaskOutput:
        out = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids, cu_seqlens=cu_seqlens,
                          max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                          output_attentions=output_attentions)
        h = out.last_hidden_state
        start_logits, end_logits = self.qa_outputs(h).unbind(-1)  # each [B, T] or [N]
        loss = None
        if start_positions is not None and end_positions is not None:
            task = span_loss(start_logits, end_logits, start_positions, end_positions, cu_seqlens, max_seqlen)
            loss = self.with_lm(task, h, input_ids, cu_seqlens)
        return TaskOutput(loss, None, start_logits, end_logits, out.hidden_states, out.attentions)


class SequenceSummary(nn.Module):
    """Hugging Face's OpenAIGPTSequenceSummary as OpenAIGPTDoubleHeadsModel configures it: dropout,
    then Linear(H, 1) on the extract token's state."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.first_dropout = nn.Dropout(float(config.summary_first_dropout))
        self.summary = nn.Linear(config.n_embd, 1)

    def forward(self, last: Tensor) -> Tensor:
        return self.summary(self.first_dropout(last)).squeeze(-1)  # [S]


class OpenAIGPTForMultipleChoice(_GPTTask):
    """Multiple choice as the paper: `context $ answer_i` for each choice, each scored from its
    extract token's final state, a softmax over the choices. Hugging Face's OpenAIGPTDoubleHeadsModel
    layout (`multiple_choice_head.summary`); L1 is the next-token loss over every choice's text."""

    def __init__(self, config: GPTConfig, lm_coef: float = LM_COEF):
        super().__init__(config, lm_coef)
        self.multiple_choice_head = SequenceSummary(config)
        init_weights(self.multiple_choice_head.summary, config.initializer_range)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                num_choices: Tensor | None = None, choice_mask: Tensor | None = None, labels: Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                max_choices: int | None = None) -> TaskOutput:
        """As BertForMultipleChoice's: [B, C, T] full rows, or packed choices [N] with num_choices [B]
        (and max_choices, their most, when the caller knows it: no host read)."""
        if cu_seqlens is None:
            if input_ids.dim() != 3:
                raise ValueError(f"input_ids must be [batch, choices, tokens], got shape {tuple(input_ids.shape)}")
            B, C, T = input_ids.shape
            input_ids = input_ids.reshape(B * C, T)
            position_ids = None if position_ids is None else position_ids.reshape(B * C, T)
            mask = choice_mask
        elif num_choices is None:
            raise ValueError("packed multiple-choice inputs need num_choices [batch]")
        out = self.encode(input_ids, attention_mask=attention_mask, position_ids=position_ids, cu_seqlens=cu_seqlens,
                          max_seqlen=max_seqlen, output_hidden_states=output_hidden_states,
                          output_attentions=output_attentions)
        h = out.last_hidden_state
        scores = self.multiple_choice_head(last_tokens(h, cu_seqlens))  # [sum C_i] or [B * C]
        if cu_seqlens is None:
            logits = scores.view(B, C)
        else:
            logits, mask = choice_block(scores, num_choices, max_choices)
        if mask is not None:
            logits = logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min)
        loss = None
        if labels is not None:
            loss = self.with_lm(F.cross_entropy(logits, labels.reshape(-1)), h, input_ids, cu_seqlens)
        return TaskOutput(loss, logits, hidden_states=out.hidden_states, attentions=out.attentions)
