"""Feature-based tagging (BERT paper, section 5.3, Table 7): a frozen BERT's hidden layers feed a small tagger.

For CoNLL-2003 NER the paper also tried the feature-based approach: BERT is not fine-tuned, and a
two-layer BiLSTM is trained on features of its hidden layers (features.py: the embeddings, the last
layer, the sum or the concatenation of the last four, ...). The last four layers side by side come
within 0.3 F1 of fine-tuning BERT-base. Here:

    packed tokens [N] -> frozen BertModel (eval mode, no gradient) -> combine_layers -> features [N, F]
      bilstm: per sequence [B, T, F] -> dropout -> BiLSTM -> [B, T, 2R] -> [N, 2R] -> dropout -> Linear -> [N, L]
      linear: dropout -> Linear -> [N, L]

F is H (4H for concat_last_four), R the LSTM size per direction, L the number of labels. The model
takes the inputs and labels of BertForTokenClassification and returns the same TaskOutput, so the
fine-tuning flow (train/finetune.py, predict.py) and the training loop use it unchanged.

Its state_dict is the tagger alone: the encoder never changes, so training checkpoints leave it out.
A saved model is a Hugging Face BertModel folder (config.json + model.safetensors, which transformers
loads) plus tagger.safetensors, whose metadata holds the tagger's settings (TaggerSettings).
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import BertConfig
from ..features import combine_layers, needs_all_layers, parse_strategy
from ..io.files import atomic_write
from ..io.hf import read_weights
from ..io.record import read_record
from ..losses import IGNORE, TaskOutput, num_labels
from ..model import BertModel, init_weights
from ..packing import pad

TAGGERS = ("bilstm", "linear")
TAGGER_FILE = "tagger.safetensors"


@dataclass
class TaggerSettings:
    """What sits on the frozen encoder; kept in tagger.safetensors' metadata, beside the weights it
    shapes, so that evaluate, predict and serve rebuild it (and in the run record's task)."""

    kind: str = "bilstm"
    strategy: str | int = "concat_last_four"  # which hidden layers, combined how (features.py)
    lstm_size: int = 256  # per direction; the paper's BiLSTM on BERT-base is 768-dimensional
    lstm_layers: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in TAGGERS:
            raise ValueError(f"unknown tagger {self.kind!r}; use one of {', '.join(TAGGERS)}")
        self.strategy = parse_strategy(self.strategy)

    @classmethod
    def of(cls, folder: str | os.PathLike) -> TaggerSettings:
        """The settings of the tagger saved in `folder`: from tagger.safetensors' metadata; a tagger of an
        older torchbert, from the run record (its config.json's torchbert_task.tagger)."""
        from safetensors import safe_open

        file = Path(folder) / TAGGER_FILE
        with safe_open(file, "pt") as f:
            meta = f.metadata() or {}
        saved = json.loads(meta["tagger"]) if "tagger" in meta else None
        if saved is None:
            record = read_record(folder)
            saved = (record.task or {}).get("tagger") if record is not None else None
        if isinstance(saved, dict):
            return cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__})
        raise ValueError(f"{file}: names no tagger settings: not a feature-based tagger torchbert wrote")

    def feature_size(self, config: BertConfig) -> int:
        """F for this encoder; a strategy it cannot give (layer 9 of 6, the last four of 2) raises here."""
        probe = [torch.zeros(1, config.hidden_size)] * (config.num_hidden_layers + 1)  # stand-in hidden states
        return combine_layers(probe, self.strategy).shape[-1]


class FeatureTagger(nn.Module):
    """A frozen BertModel, and a BiLSTM or linear tagger trained on its per-token features."""

    def __init__(self, config: BertConfig, settings: TaggerSettings, encoder: BertModel | None = None):
        """config carries the labels (id2label); settings, the tagger; encoder: the weights to freeze."""
        super().__init__()
        self.config = config
        self.settings = s = settings
        width = s.feature_size(config)
        # the pooler sees [CLS] only and feeds nothing here
        self.bert = encoder if encoder is not None else BertModel(config, add_pooling_layer=False)
        self.bert.requires_grad_(False)
        self.bert.eval()
        self.dropout = nn.Dropout(s.dropout)
        self.lstm = None
        if s.kind == "bilstm":
            self.lstm = nn.LSTM(width, s.lstm_size, s.lstm_layers, batch_first=True, bidirectional=True,
                                dropout=s.dropout if s.lstm_layers > 1 else 0.0)
            width = 2 * s.lstm_size
        self.classifier = nn.Linear(width, num_labels(config))
        init_weights(self.classifier, config.initializer_range)
        self.register_state_dict_post_hook(_drop_encoder)
        self.register_load_state_dict_pre_hook(_keep_encoder)

    def train(self, mode: bool = True) -> FeatureTagger:
        """The tagger switches mode; the encoder stays in eval mode, so its features never see dropout."""
        super().train(mode)
        self.bert.eval()
        return self

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, cu_seqlens: Tensor | None = None, max_seqlen: int | None = None,
                labels: Tensor | None = None, labelled_only: bool = False,
                label_positions: Tensor | None = None) -> TaskOutput:
        """Packed input_ids [N] with cu_seqlens, or padded [B, T] with a right-padded attention_mask.
        labels: [N] or [B, T], -100 where a token has none. logits: [N, L] or [B, T, L]; with
        labelled_only (and labels), [M, L] for the labelled tokens only (at label_positions [M] when
        given), as BertForTokenClassification."""
        strategy = self.settings.strategy
        with torch.no_grad():  # the encoder is fixed: nothing to backpropagate into
            out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, cu_seqlens=cu_seqlens,
                            max_seqlen=max_seqlen, output_hidden_states=needs_all_layers(strategy))
            h = out.last_hidden_state if out.hidden_states is None else combine_layers(out.hidden_states, strategy)
        if self.lstm is not None:
            h = self.run_lstm(self.dropout(h), attention_mask, cu_seqlens, max_seqlen)
        if labelled_only and labels is not None:
            keep = label_positions if label_positions is not None else (labels.reshape(-1) != IGNORE).nonzero().squeeze(1)
            h, labels = h.reshape(-1, h.shape[-1])[keep], labels.reshape(-1)[keep]  # [M, F], [M]
        logits = self.classifier(self.dropout(h))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
        return TaskOutput(loss, logits)

    def run_lstm(self, x: Tensor, attention_mask: Tensor | None, cu_seqlens: Tensor | None,
                 max_seqlen: int | None) -> Tensor:
        """The BiLSTM over each sequence alone: packed [N, F] -> [N, 2R], padded [B, T, F] -> [B, T, 2R]."""
        if cu_seqlens is not None:
            lengths = cu_seqlens.diff()  # [B]
            T = int(max_seqlen) if max_seqlen is not None else int(lengths.max())
            x = pad(x, cu_seqlens, T)  # [B, T, F]
        else:
            T = x.shape[1]
            lengths = attention_mask.sum(1) if attention_mask is not None else torch.full((x.shape[0],), T)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        y, _ = nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=T)  # [B, T, 2R]
        if cu_seqlens is None:
            return y
        return y[torch.arange(T, device=y.device) < lengths[:, None]]  # [N, 2R]: back to the packed tokens

    # -- files --------------------------------------------------------------------------------------

    @classmethod
    def from_encoder(cls, path: str | os.PathLike, config: BertConfig, settings: TaggerSettings) -> FeatureTagger:
        """A new tagger on the frozen encoder of a Hugging Face folder; its pooler or task head is not used."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # those unused tensors are reported as warnings
            encoder = BertModel.from_pretrained(path, config=config, add_pooling_layer=False)
        return cls(config, settings, encoder)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> FeatureTagger:
        """A saved tagger: the encoder from model.safetensors, the tagger from tagger.safetensors."""
        path = Path(path)
        file = path / TAGGER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such file; {path} holds no feature-based tagger")
        model = cls.from_encoder(path, BertConfig.load(path), TaggerSettings.of(path))
        try:
            model.load_state_dict(read_weights(file))
        except RuntimeError as e:  # torch's first line only says that loading failed; the next, what
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            raise ValueError(f"{file}: does not fit the tagger that config.json describes "
                             f"({lines[min(1, len(lines) - 1)]})") from None
        return model

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """config.json and model.safetensors (the encoder, as a Hugging Face BertModel), and tagger.safetensors."""
        from safetensors.torch import save_file

        path = Path(path)
        self.bert.save_pretrained(path)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        meta = {"format": "pt", "tagger": json.dumps(asdict(self.settings))}
        atomic_write(path / TAGGER_FILE, lambda tmp: save_file(state, tmp, metadata=meta))


def _drop_encoder(module: FeatureTagger, state: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict hook: the encoder's tensors are not part of the trained state."""
    for k in [k for k in state if k.startswith(prefix + "bert.")]:
        del state[k]


def _keep_encoder(module: FeatureTagger, state: dict, prefix: str, local_metadata: dict, strict: bool,
                  missing: list, unexpected: list, errors: list) -> None:
    """load_state_dict hook: a state without the encoder (what state_dict gives) leaves it as it is."""
    for k, v in module.bert.state_dict().items():
        state.setdefault(f"{prefix}bert.{k}", v)
