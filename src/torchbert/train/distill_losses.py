"""The losses a distilled student learns its teacher by (train/distill.py puts them together).

The soft targets (Hinton et al. 2015): T^2 * KL(teacher_T || student_T), X_T the softmax of the
logits over the temperature T; what is a distribution depends on the family (its `soft_targets`,
registered below by name):

    classes     a sequence's classes (classification, pairs) or a labelled token's tags; one output
                (regression) is matched by the squared error to the teacher's score, several labels each
                (multi-label) by the binary cross-entropy to the teacher's sigmoid at T
    choices     an example's rows: multiple choice's choices, a reranker's candidates
    spans       a window's tokens, once for the answer's start and once for its end (their mean)
    embeddings  a text's vector: the squared error to the teacher's (and of each Matryoshka prefix)

The teacher's layers (the teacher run beside the student at every step):

    hidden      TinyBERT's (Jiao et al. 2020): the squared error of the student's embeddings and of its
                layer i of K to the teacher's layer round(i L / K), the mean over a sequence's tokens
                and the features, summed over the layers (`layer_map`, `hidden_loss`)
    relation    MiniLMv2's (Wang et al. 2021): KL(teacher || student) of the last layer's query-query,
                key-key and value-value relations, softmax(x_a x_a^T / sqrt(d)) for each relation head
                a (`relation_heads`), the mean over the heads and a sequence's tokens, summed over the
                three; relations are T x T whatever the width, so a student of any width learns them
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..losses import choice_block
from ..packing import pad
from ..tasks.batches import TaskBatch


# -- the soft targets, by kind ----------------------------------------------------------------------

def soft_kl(student: Tensor, teacher: Tensor, temperature: float, mask: Tensor | None = None) -> Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)) over the last dimension, summed over the
    rest; mask (the shape of the logits): the entries that are outcomes (others weigh nothing)."""
    s, t = student.float() / temperature, teacher.float() / temperature
    if mask is not None:
        s, t = s.masked_fill(~mask, float("-inf")), t.masked_fill(~mask, float("-inf"))
    log_s, log_t = s.log_softmax(-1), t.log_softmax(-1)
    terms = log_t.exp() * (log_t - log_s)
    if mask is not None:
        terms = terms.masked_fill(~mask, 0.0)
    return terms.sum() * temperature ** 2


class SoftTargets:
    """What a family's head outputs as soft targets: `pieces` (the teacher's outputs of a batch as
    [P, D] and the pieces of each of its rows, in order), `gather` (the pieces of a batch's rows, made
    back into the head's layout) and `loss` (the soft-target loss of a student's outputs, summed over
    the batch's targets: the family's `count`). `labelled`: the student learns the labels too (else the
    teacher's outputs alone, and the model runs without targets)."""

    labelled = True

    def pieces(self, out, batch: TaskBatch) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def gather(self, flat: Tensor, batch: TaskBatch):
        return flat

    def loss(self, out, teacher, batch: TaskBatch, temperature: float, config) -> Tensor:
        raise NotImplementedError

    def agree(self, out, teacher, batch: TaskBatch) -> Tensor:
        """The targets where the student's answer (argmax) is the teacher's."""
        raise NotImplementedError


class ClassTargets(SoftTargets):
    def pieces(self, out, batch):
        logits = out.logits.float()  # [S, C] a sequence's, or [M, C] the labelled tokens'
        rows = batch.cu_seqlens.numel() - 1
        if batch.label_positions is None:  # a sequence's logits
            return logits, torch.ones(rows, dtype=torch.long)
        row = torch.bucketize(batch.label_positions, batch.cu_seqlens[1:].long(), right=True)
        return logits, torch.bincount(row, minlength=rows)

    def loss(self, out, teacher, batch, temperature, config):
        student = out.logits.float()
        if student.shape[-1] == 1:  # a score (regression): the teacher's, as a target
            return ((student - teacher) ** 2).sum()
        if config.extra.get("problem_type") == "multi_label_classification":
            target = (teacher / temperature).sigmoid()
            return F.binary_cross_entropy_with_logits(student / temperature, target, reduction="sum") \
                * temperature ** 2 / student.shape[-1]
        return soft_kl(student, teacher, temperature)

    def agree(self, out, teacher, batch):
        return (out.logits.argmax(-1) == teacher.argmax(-1)).sum()


class ChoiceTargets(SoftTargets):
    def pieces(self, out, batch):
        _, mask = choice_block(out.logits.new_zeros(batch.num_choices.sum()), batch.num_choices, batch.max_choices)
        scores = out.logits.float()[mask]  # [S] each row's score, example by example
        return scores[:, None], torch.ones(len(scores), dtype=torch.long)

    def gather(self, flat, batch):
        return choice_block(flat[:, 0], batch.num_choices, batch.max_choices)  # [E, C] and its mask

    def loss(self, out, teacher, batch, temperature, config):
        scores, mask = teacher
        return soft_kl(out.logits, scores, temperature, mask)

    def agree(self, out, teacher, batch):
        scores, mask = teacher  # the student's filler slots are at the lowest score already
        return (out.logits.argmax(-1) == scores.masked_fill(~mask, float("-inf")).argmax(-1)).sum()


class SpanTargets(SoftTargets):
    def pieces(self, out, batch):
        both = torch.stack([out.start_logits, out.end_logits], -1).float()  # [N, 2]
        return both, batch.cu_seqlens.diff().long()

    def loss(self, out, teacher, batch, temperature, config):
        mask = pad(torch.ones(batch.num_tokens, dtype=torch.bool, device=teacher.device), batch.cu_seqlens,
                   batch.max_seqlen, False)  # [S, T]
        total = 0.0
        for k, student in enumerate((out.start_logits, out.end_logits)):
            s = pad(student.float(), batch.cu_seqlens, batch.max_seqlen)
            t = pad(teacher[:, k], batch.cu_seqlens, batch.max_seqlen)
            total = total + soft_kl(s, t, temperature, mask)
        return total / 2

    def agree(self, out, teacher, batch):
        """The windows where the student's start and end are both the teacher's."""
        def best(logits):  # [N] -> [S] each window's argmax over its own tokens
            return pad(logits.float(), batch.cu_seqlens, batch.max_seqlen, float("-inf")).argmax(-1)

        starts, ends = best(out.start_logits) == best(teacher[:, 0]), best(out.end_logits) == best(teacher[:, 1])
        return (starts & ends).sum()


class EmbeddingTargets(SoftTargets):
    labelled = False

    def pieces(self, out, batch):
        emb = out.embeddings.float()  # [S, H] a vector per text
        return emb, torch.ones(len(emb), dtype=torch.long)

    def loss(self, out, teacher, batch, temperature, config):
        student = out.embeddings.float()
        total = 0.0
        for d in (student.shape[-1], *(config.extra.get("matryoshka") or ())):
            total = total + ((student[:, :d] - teacher[:, :d]) ** 2).mean(-1).sum()
        return total

    @staticmethod
    def correct(out, teacher: Tensor) -> Tensor:
        """The texts whose vector is nearer (by cosine) their own teacher vector than any other of the batch's."""
        scores = F.normalize(out.embeddings.float(), dim=-1) @ F.normalize(teacher, dim=-1).T  # [S, S]
        return (scores.argmax(-1) == torch.arange(len(scores), device=scores.device)).sum()


SOFT_TARGETS: dict[str, SoftTargets] = {"classes": ClassTargets(), "choices": ChoiceTargets(),
                                        "spans": SpanTargets(), "embeddings": EmbeddingTargets()}


# -- the teacher's layers, learned at every step --------------------------------------------------------

def layer_map(teacher_layers: int, student_layers: int) -> list[tuple[int, int]]:
    """The (student, teacher) hidden states the hidden-state loss pairs, 0 being the embeddings: the
    student's layer i of K with the teacher's round(i L / K) (TinyBERT's uniform map: last to last)."""
    return [(0, 0)] + [(i, round(i * teacher_layers / student_layers)) for i in range(1, student_layers + 1)]


def hidden_loss(student: tuple[Tensor, ...], teacher: tuple[Tensor, ...], pairs, cu_seqlens: Tensor) -> Tensor:
    """Summed over the packed sequences: the squared error of the paired hidden states ([N, H] each),
    its mean over a sequence's tokens and the features, summed over the pairs."""
    per_token = sum(((student[i].float() - teacher[j].float()) ** 2).mean(-1) for i, j in pairs)  # [N]
    lengths = cu_seqlens.diff()
    seq = torch.arange(len(lengths), device=per_token.device).repeat_interleave(lengths, output_size=len(per_token))
    return (per_token / lengths[seq]).sum()


def log_relations(x: Tensor, cu_seqlens: Tensor, max_seqlen: int, heads: int) -> Tensor:
    """log softmax(x_a x_a^T / sqrt(d)) over the keys, for each head a (d = H / heads) of the packed
    projections x [N, H]: [S, A, T, T], the keys past a sequence's end weighing nothing."""
    block = pad(x.float(), cu_seqlens, max_seqlen)  # [S, T, H]
    S, T, H = block.shape
    block = block.view(S, T, heads, H // heads).transpose(1, 2)  # [S, A, T, d]
    scores = block @ block.transpose(-1, -2) / math.sqrt(H // heads)  # [S, A, T, T]
    real = torch.arange(T, device=x.device) < cu_seqlens.diff()[:, None]  # [S, T]
    return scores.masked_fill(~real[:, None, None, :], torch.finfo(scores.dtype).min).log_softmax(-1)


def relation_loss(student_qkv: Tensor, teacher_qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                  heads: int) -> Tensor:
    """Summed over the packed sequences: KL(teacher || student) of the query-query, key-key and
    value-value relations (`log_relations`; stacked projections [N, 3H] each, widths may differ), the
    mean over the heads and a sequence's tokens, summed over the three (MiniLMv2)."""
    lengths = cu_seqlens.diff()
    real = torch.arange(max_seqlen, device=lengths.device) < lengths[:, None]  # [S, T]
    total = 0.0
    for s, t in zip(student_qkv.chunk(3, -1), teacher_qkv.chunk(3, -1)):
        log_s, log_t = (log_relations(x, cu_seqlens, max_seqlen, heads) for x in (s, t))
        kl = (log_t.exp() * (log_t - log_s)).masked_fill(~real[:, None, None, :], 0.0).sum(-1)  # [S, A, T]
        kl = kl.masked_fill(~real[:, None, :], 0.0)
        total = total + (kl.sum((1, 2)) / (heads * lengths)).sum()
    return total


def relation_heads(teacher_width: int, student_width: int, teacher_heads: int) -> int:
    """The heads the relations are split into: the teacher's attention heads where they divide both
    widths, else the most below them that do (MiniLMv2 takes the count apart from the model's heads)."""
    return max(a for a in range(1, teacher_heads + 1) if teacher_width % a == 0 and student_width % a == 0)


def last_qkv(model: nn.Module, hidden_states: tuple[Tensor, ...]) -> Tensor:
    """The last layer's stacked query, key and value projections [N, 3H], of its input (the states
    before it), before any rotary turn."""
    from ..fast.bf16 import encoders
    return encoders(model)[0].layers[-1].attention.qkv(hidden_states[-2])


def last_layer_relations(student: nn.Module, student_states: tuple[Tensor, ...], teacher: nn.Module,
                         teacher_states: tuple[Tensor, ...], cu_seqlens: Tensor, max_seqlen: int) -> Tensor:
    """The relation loss of the student's last layer against the teacher's (each model's hidden states
    of the packed batch; the teacher's side without gradients), in the relation heads both widths take."""
    from ..fast.bf16 import encoders

    with torch.no_grad():
        theirs = last_qkv(teacher, teacher_states)
    t, width = encoders(teacher)[0].config, encoders(student)[0].config.hidden_size
    return relation_loss(last_qkv(student, student_states), theirs, cu_seqlens, max_seqlen,
                         relation_heads(t.hidden_size, width, t.num_attention_heads))
