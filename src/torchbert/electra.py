"""ELECTRA (Clark et al., 2020): pretrain a BERT encoder as the discriminator of replaced-token detection.

    masked input -> generator (a narrow BERT sharing the discriminator's embeddings) -> MLM logits at
                    the masked positions -> a token sampled there from the generator's softmax
    corrupted input (the masked positions hold the samples) -> discriminator (BertModel) -> for every
                    token: was it replaced? (dense, activation, dense to one logit)
    loss = generator MLM loss (mean over masked tokens) + 50 x discriminator loss (mean over all tokens)

The discriminator learns from every token, not the 15% that are masked: ELECTRA-Small scored 79.9 on
GLUE against BERT-Small's 75.1 at equal compute, and the gain grows as models shrink. The sampling is
not differentiated through (the generator learns by MLM alone). A sample equal to the original
token counts as original.

The discriminator is BERT's encoder exactly: fine-tuning, features, serving and export read it as any
BERT (`save_pretrained` writes it as a Hugging Face BertModel). The generator has the discriminator's
depth and 1/4 of its width by default (the paper found 1/4 to 1/2 best), its embeddings are the
discriminator's (word, position and token type, as in the paper), projected to its width, and its
MLM head projects back to the embedding width before the tied decoder, as transformers'
ElectraForMaskedLM with embedding_size = the discriminator's hidden size. `to_hf` gives both halves
in transformers' ELECTRA layout (ElectraForPreTraining, ElectraForMaskedLM), tested to parity.

Shapes: N packed tokens (or B x T padded), M masked, H the discriminator's width, G the generator's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .architectures import HFCheckpoint
from .config import BertConfig
from .heads import init_heads, mlm_targets
from .io.hf import bert_key_map, convert_to_hf
from .model import BertModel, activation

GENERATOR_SIZE = 0.25  # the generator's width as a share of the discriminator's
RTD_WEIGHT = 50.0  # the paper's lambda: the discriminator's loss is about 50 times smaller per token


def generator_config(config: BertConfig, size: float) -> BertConfig:
    """The generator's config: the discriminator's depth, `size` of its width, heads of the same size
    as the discriminator's (at least one), a 4x feed-forward."""
    heads = max(1, round(config.num_attention_heads * size))
    width = heads * config.head_size
    return dataclasses.replace(config, hidden_size=width, num_attention_heads=heads, intermediate_size=4 * width,
                               extra={})


class ProjectedEmbeddings(nn.Module):
    """The discriminator's embeddings (held, not owned: their parameters are the discriminator's),
    projected to the generator's width: [.., H] -> [.., G]."""

    def __init__(self, shared: nn.Module, hidden: int, width: int):
        super().__init__()
        object.__setattr__(self, "shared", shared)  # not a submodule: one copy of each parameter
        self.project = nn.Linear(hidden, width)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        return self.project(self.shared(input_ids, token_type_ids, position_ids))


class GeneratorHead(nn.Module):
    """[M, G] -> dense to H, activation, LayerNorm -> the tied decoder [M, V]."""

    def __init__(self, config: BertConfig, width: int):
        super().__init__()
        self.dense = nn.Linear(width, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        return F.linear(self.norm(self.act(self.dense(h))), word_embeddings, self.bias)  # [M, V]


class DiscriminatorHead(nn.Module):
    """[.., H] -> dense, activation, dense -> one logit per token: replaced (> 0) or original."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, h: Tensor) -> Tensor:
        return self.prediction(self.act(self.dense(h))).squeeze(-1)


@dataclass
class ElectraOutput:
    loss: Tensor | None = None  # mlm_loss + RTD_WEIGHT * rtd_loss
    mlm_loss: Tensor | None = None  # the generator's, mean over masked tokens
    rtd_loss: Tensor | None = None  # the discriminator's, mean over every real token
    mlm_logits: Tensor | None = None  # [M, V]
    mlm_labels: Tensor | None = None  # [M]
    rtd_logits: Tensor | None = None  # [N] packed, [B, T] padded
    rtd_labels: Tensor | None = None  # like rtd_logits: 1.0 where the token was replaced
    real: Tensor | None = None  # like rtd_logits: True at real tokens (padded input); None when packed
    corrupted: Tensor | None = None  # the discriminator's input: the generator's samples at the masked positions


# what an older torchbert kept in config.json, the run record's now (io/record.py)
OLD_RECORD_KEYS = ("torchbert_objective", "torchbert_generator_size")


class ElectraForPreTraining(HFCheckpoint, nn.Module):
    def __init__(self, config: BertConfig, generator_size: float | None = None):
        """generator_size: the generator's width as a share of the discriminator's (default: 1/4, or what
        an older torchbert kept in config.json as torchbert_generator_size; a run's own is in its run
        record, io/record.py)."""
        super().__init__()
        if generator_size is None:
            generator_size = float(config.extra.get("torchbert_generator_size", GENERATOR_SIZE))
        if not 0 < generator_size <= 1:
            raise ValueError(f"generator_size must be in (0, 1], got {generator_size}")
        self.config = config
        self.generator_size = generator_size
        self.bert = BertModel(config, add_pooling_layer=False)  # the discriminator: what fine-tuning reads
        self.rtd = DiscriminatorHead(config)
        gen = generator_config(config, generator_size)
        self.generator = BertModel(gen, add_pooling_layer=False)
        self.generator.embeddings = ProjectedEmbeddings(self.bert.embeddings, config.hidden_size, gen.hidden_size)
        self.generator_head = GeneratorHead(config, gen.hidden_size)
        init_heads(self, (self.rtd, self.generator.embeddings, self.generator_head))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, mlm_positions: Tensor | None = None,
                mlm_labels: Tensor | None = None, generator: torch.Generator | None = None) -> ElectraOutput:
        """Masked input ([N] packed with cu_seqlens, or [B, T] with attention_mask) and its MLM targets
        (mlm_positions and mlm_labels, or transformers-style labels [B, T] with -100 elsewhere)."""
        positions, targets = mlm_targets(labels, mlm_positions, mlm_labels)
        if positions is None:
            raise ValueError("ELECTRA needs the masked positions and their tokens (mlm_positions and mlm_labels, "
                             "or labels)")
        kw = dict(cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
        g = self.generator(input_ids, attention_mask, token_type_ids, position_ids, output_positions=positions, **kw)
        mlm_logits = self.generator_head(g.last_hidden_state, self.bert.embeddings.word.weight)  # [M, V]
        mlm_loss = F.cross_entropy(mlm_logits, targets)
        with torch.no_grad():  # a sample from the generator at each masked position (not differentiated)
            probs = mlm_logits.float().softmax(-1)
            sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1) if len(probs) else targets
        flat = input_ids.reshape(-1)
        corrupted = flat.index_put((positions,), sampled).view_as(input_ids)
        replaced = torch.zeros(flat.shape, dtype=torch.float32, device=flat.device)
        replaced[positions] = (sampled != targets).float()
        d = self.bert(corrupted, attention_mask, token_type_ids, position_ids, **kw)
        rtd_logits = self.rtd(d.last_hidden_state)  # [N] or [B, T]
        replaced = replaced.view_as(rtd_logits)
        real = None if attention_mask is None else attention_mask.bool()
        losses = F.binary_cross_entropy_with_logits(rtd_logits.float(), replaced, reduction="none")
        rtd_loss = losses.mean() if real is None else losses[real].mean()
        return ElectraOutput(mlm_loss + RTD_WEIGHT * rtd_loss, mlm_loss, rtd_loss, mlm_logits, targets, rtd_logits,
                             replaced, real, corrupted)

    def save_pretrained(self, path) -> None:
        """The discriminator, as the BERT encoder that every torchbert command and transformers' BertModel
        read; config.json holds the model alone (the objective and the generator's size are the run
        record's: train/pretrain.py writes it)."""
        extra = self.bert.config.extra
        self.bert.config.extra = {k: v for k, v in extra.items() if k not in OLD_RECORD_KEYS}  # an older run's
        try:
            self.bert.save_pretrained(path)
        finally:
            self.bert.config.extra = extra

    def to_hf(self) -> tuple[dict, dict, dict, dict]:
        """(discriminator state, its config, generator state, its config) in transformers' ELECTRA layout:
        ElectraForPreTraining and ElectraForMaskedLM, embedding_size = the discriminator's hidden size."""
        common = {k: getattr(self.config, k) for k in ("vocab_size", "max_position_embeddings", "type_vocab_size",
                                                        "layer_norm_eps", "initializer_range", "pad_token_id",
                                                        "hidden_act", "num_hidden_layers")}
        common.update(model_type="electra", embedding_size=self.config.hidden_size,
                      hidden_dropout_prob=self.config.hidden_dropout_prob,
                      attention_probs_dropout_prob=self.config.attention_probs_dropout_prob)
        disc = {f"electra.{k}": v for k, v in convert_to_hf(self.bert).items()}
        disc.update({"discriminator_predictions.dense.weight": self.rtd.dense.weight,
                     "discriminator_predictions.dense.bias": self.rtd.dense.bias,
                     "discriminator_predictions.dense_prediction.weight": self.rtd.prediction.weight,
                     "discriminator_predictions.dense_prediction.bias": self.rtd.prediction.bias})
        gen_cfg = self.generator.config
        gen = {f"electra.{k}": v for k, v in _layers_to_hf(self.generator).items()}
        gen.update({f"electra.{k}": v for k, v in convert_to_hf(self.bert).items() if k.startswith("embeddings.")})
        gen.update({"electra.embeddings_project.weight": self.generator.embeddings.project.weight,
                    "electra.embeddings_project.bias": self.generator.embeddings.project.bias,
                    "generator_predictions.dense.weight": self.generator_head.dense.weight,
                    "generator_predictions.dense.bias": self.generator_head.dense.bias,
                    "generator_predictions.LayerNorm.weight": self.generator_head.norm.weight,
                    "generator_predictions.LayerNorm.bias": self.generator_head.norm.bias,
                    "generator_lm_head.weight": self.bert.embeddings.word.weight,
                    "generator_lm_head.bias": self.generator_head.bias})
        disc_config = {**common, "hidden_size": self.config.hidden_size, "intermediate_size": self.config.intermediate_size,
                       "num_attention_heads": self.config.num_attention_heads, "architectures": ["ElectraForPreTraining"]}
        gen_config = {**common, "hidden_size": gen_cfg.hidden_size, "intermediate_size": gen_cfg.intermediate_size,
                      "num_attention_heads": gen_cfg.num_attention_heads, "architectures": ["ElectraForMaskedLM"]}
        return ({k: v.detach() for k, v in disc.items()}, disc_config, {k: v.detach() for k, v in gen.items()},
                gen_config)


def _layers_to_hf(encoder: BertModel) -> dict[str, Tensor]:
    """An encoder's transformer layers under Hugging Face's names (encoder.layer.i....)."""
    params = encoder.state_dict()
    out = {}
    for ours, theirs in bert_key_map(encoder.config, pooler=False).items():
        if ours.startswith("layers."):
            for h, t in zip(theirs, params[ours].chunk(len(theirs))):
                out[h] = t
    return out
