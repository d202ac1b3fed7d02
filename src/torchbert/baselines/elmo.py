"""ELMo: Deep contextualized word representations (Peters et al., 2018), the feature-based baseline
that BERT is measured against: two language models, one reading left to right and one right to
left, trained together but never seeing each other's states.

    tokens -> x_k = token embedding [D] (shared by both directions)
      forward:  x -> L x [LSTM (cells C, projection to D), + residual after the first] -> h_fwd_j
      backward: the same stack, separate weights, on each sequence reversed                -> h_bwd_j
      P(t_{k+1} | t_1..t_k)  = softmax(W h_fwd_L,k + b)
      P(t_{k-1} | t_k..t_n)  = softmax(W h_bwd_L,k + b)      (W, b shared by the two directions)
    loss = forward NLL + backward NLL

A downstream task reads the biLM frozen: the L + 1 representations of each token ([x_k; x_k] and
[h_fwd_j; h_bwd_j], each 2D wide) are collapsed by a scalar mix learned with the task,
ELMo_k = gamma * sum_j softmax(s)_j h_k,j, and fed to a task model of its own: a BiLSTM tagger, or a
BiLSTM with max pooling for sequence classification and regression (a pair is read as one
sequence, `[CLS] a [SEP] b [SEP]`). Inputs are packed [N] with cu_seqlens, as every torchbert model
takes them, or [B, T] rows that are all full.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..config import ELMoConfig
from ..architectures import HFCheckpoint
from ..losses import IGNORE, TaskOutput, next_tokens, num_labels, previous_tokens, sequence_loss
from ..packing import pad


def reverse_index(cu_seqlens: Tensor, n: int) -> Tensor:
    """[N]: for each packed token, the position of its mirror image in its own sequence."""
    lengths = cu_seqlens.diff().long()
    starts = cu_seqlens[:-1].long().repeat_interleave(lengths, output_size=n)
    ends = cu_seqlens[1:].long().repeat_interleave(lengths, output_size=n)
    return starts + ends - 1 - torch.arange(n, device=cu_seqlens.device)


def full_rows(input_ids: Tensor) -> tuple[Tensor, Tensor, int]:
    """[B, T] rows, every one full -> packed [N], cu_seqlens, T."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, tokens] (or packed [N] with cu_seqlens), "
                         f"got shape {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    return input_ids.reshape(-1), torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=input_ids.device), T


class LSTMStack(nn.Module):
    """One direction: num_layers LSTMs with projections, a residual connection around each layer
    after the first, dropout between layers."""

    def __init__(self, config: ELMoConfig):
        super().__init__()
        d, c = config.projection_dim, config.cell_size
        self.layers = nn.ModuleList(nn.LSTM(d, c, proj_size=d, batch_first=True) for _ in range(config.num_layers))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> list[Tensor]:
        """x [B, T, D], each sequence from its first token on -> each layer's states [B, T, D]."""
        states, h = [], x
        for i, lstm in enumerate(self.layers):
            with warnings.catch_warnings():  # "LSTM with projections is not supported with oneDNN": the plain kernel
                warnings.simplefilter("ignore", UserWarning)
                y, _ = lstm(self.dropout(h))  # padding follows every sequence: no state of a real token sees it
            h = y if i == 0 else y + h
            states.append(h)
        return states


@dataclass
class ELMoOutput:
    layers: tuple[Tensor, ...]  # L + 1 tensors [N, 2D]: [x; x], then [h_fwd_j; h_bwd_j]
    forward_top: Tensor  # [N, D]
    backward_top: Tensor  # [N, D]


class ELMoModel(HFCheckpoint, nn.Module):
    config_class = ELMoConfig

    def __init__(self, config: ELMoConfig):
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.projection_dim)
        self.forward_lstm = LSTMStack(config)
        self.backward_lstm = LSTMStack(config)
        nn.init.normal_(self.tokens.weight, std=config.initializer_range)

    def forward(self, input_ids: Tensor, *, cu_seqlens: Tensor | None = None,
                max_seqlen: int | None = None) -> ELMoOutput:
        if cu_seqlens is None:
            input_ids, cu_seqlens, max_seqlen = full_rows(input_ids)
        n = input_ids.numel()
        T = int(max_seqlen) if max_seqlen is not None else int(cu_seqlens.diff().max())
        mask = torch.arange(T, device=input_ids.device) < cu_seqlens.diff()[:, None]  # [B, T]
        x = self.tokens(input_ids)  # [N, D]
        mirror = reverse_index(cu_seqlens, n)
        fwd = self.forward_lstm(pad(x, cu_seqlens, T))  # L x [B, T, D]
        bwd = self.backward_lstm(pad(x[mirror], cu_seqlens, T))  # each sequence read from its end
        layers = [torch.cat([x, x], -1)]
        for f, b in zip(fwd, bwd):
            layers.append(torch.cat([f[mask], b[mask][mirror]], -1))  # [N, 2D], both in reading order
        d = x.shape[1]
        return ELMoOutput(tuple(layers), forward_top=layers[-1][:, :d], backward_top=layers[-1][:, d:])


@dataclass
class BiLMOutput:
    loss: Tensor | None = None  # forward_loss + backward_loss
    forward_loss: Tensor | None = None  # mean next-token cross-entropy
    backward_loss: Tensor | None = None  # mean previous-token cross-entropy
    forward_logits: Tensor | None = None  # [N, V]
    backward_logits: Tensor | None = None  # [N, V]


class ELMoBiLM(HFCheckpoint, nn.Module):
    """The biLM's pretraining objective: both directions' log-likelihoods, through one softmax."""

    config_class = ELMoConfig

    def __init__(self, config: ELMoConfig):
        super().__init__()
        self.config = config
        self.elmo = ELMoModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(config.projection_dim, config.vocab_size)  # shared by both directions
        nn.init.normal_(self.softmax.weight, std=config.initializer_range)
        nn.init.zeros_(self.softmax.bias)

    def forward(self, input_ids: Tensor, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None) -> BiLMOutput:
        """labels: the sequences themselves (as GPT's): position k is scored against labels[k + 1]
        forward and labels[k - 1] backward, within its sequence."""
        if cu_seqlens is None:
            input_ids, cu_seqlens, max_seqlen = full_rows(input_ids)
            labels = None if labels is None else labels.reshape(-1)
        out = self.elmo(input_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        fwd = self.softmax(self.dropout(out.forward_top))  # [N, V]
        bwd = self.softmax(self.dropout(out.backward_top))  # [N, V]
        if labels is None:
            return BiLMOutput(forward_logits=fwd, backward_logits=bwd)
        f = F.cross_entropy(fwd.float(), next_tokens(labels, cu_seqlens), ignore_index=IGNORE)
        b = F.cross_entropy(bwd.float(), previous_tokens(labels, cu_seqlens), ignore_index=IGNORE)
        return BiLMOutput(f + b, f, b, fwd, bwd)


class ScalarMix(nn.Module):
    """ELMo_k = gamma * sum_j softmax(s)_j h_k,j: the task's weighting of the biLM's layers."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(num_layers))  # s: equal weights to start
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: tuple[Tensor, ...]) -> Tensor:
        weights = self.scalars.softmax(0)
        return self.gamma * sum(w * h for w, h in zip(weights, layers))


class _ELMoTask(HFCheckpoint, nn.Module):
    """The frozen biLM (no gradient, no dropout: its state never changes), the scalar mix, dropout,
    and a BiLSTM of the task's own over the mixed features (2D -> 2 x projection_dim)."""

    config_class = ELMoConfig
    lstm_layers = 1

    def __init__(self, config: ELMoConfig):
        super().__init__()
        self.config = config
        self.elmo = ELMoModel(config)
        self.elmo.requires_grad_(False)
        self.mix = ScalarMix(config.num_layers + 1)
        p = config.extra.get("classifier_dropout")
        self.dropout = nn.Dropout(0.5 if p is None else p)  # the paper's dropout on ELMo's features
        d = config.projection_dim
        self.lstm = nn.LSTM(2 * d, d, num_layers=self.lstm_layers, batch_first=True, bidirectional=True,
                            dropout=0.0 if self.lstm_layers == 1 else config.dropout)

    def train(self, mode: bool = True) -> _ELMoTask:
        super().train(mode)
        self.elmo.eval()
        return self

    def features(self, input_ids: Tensor, cu_seqlens: Tensor | None, max_seqlen: int | None):
        """-> the task BiLSTM's states [B, T, 2D] (zero at padding), the token mask [B, T], and the packed ids."""
        if cu_seqlens is None:
            input_ids, cu_seqlens, max_seqlen = full_rows(input_ids)
        with torch.no_grad():
            layers = self.elmo(input_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen).layers
        T = int(max_seqlen) if max_seqlen is not None else int(cu_seqlens.diff().max())
        x = pad(self.dropout(self.mix(layers)), cu_seqlens, T)  # [B, T, 2D]
        lengths = cu_seqlens.diff()
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=T)  # [B, T, 2D]
        mask = torch.arange(T, device=x.device) < lengths[:, None]
        return self.dropout(h), mask


class ELMoForSequenceClassification(_ELMoTask):
    """ELMo features -> BiLSTM -> max pooling over the tokens -> Linear: classification, or
    regression with one output (heads.sequence_loss)."""

    def __init__(self, config: ELMoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(2 * config.projection_dim, num_labels(config))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None) -> TaskOutput:
        if attention_mask is not None:
            raise ValueError("ELMo task models take packed input (cu_seqlens), not padding")
        h, mask = self.features(input_ids, cu_seqlens, max_seqlen)
        pooled = h.masked_fill(~mask[..., None], float("-inf")).amax(1)  # [B, 2D]
        logits = self.classifier(pooled)  # [B, num_labels]
        loss = None if labels is None else sequence_loss(self.config, logits, labels)
        return TaskOutput(loss, logits)


class ELMoForTokenClassification(_ELMoTask):
    """ELMo features -> a two-layer BiLSTM -> Linear on every token (the paper's NER tagger without
    its CRF)."""

    lstm_layers = 2

    def __init__(self, config: ELMoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(2 * config.projection_dim, num_labels(config))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, labelled_only: bool = False,
                label_positions: Tensor | None = None) -> TaskOutput:
        """Logits [N, C] for every packed token ([B * T, C] for full rows), or [M, C] for the labelled
        ones only (labelled_only, with labels; at label_positions [M] when given)."""
        if attention_mask is not None:
            raise ValueError("ELMo task models take packed input (cu_seqlens), not padding")
        h, mask = self.features(input_ids, cu_seqlens, max_seqlen)
        states = h[mask]  # [N, 2D]
        if labelled_only and labels is not None:
            keep = label_positions if label_positions is not None else (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)
            states, labels = states[keep], labels.reshape(-1)[keep]
        logits = self.classifier(states)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels.reshape(-1), ignore_index=IGNORE)
        return TaskOutput(loss, logits)
