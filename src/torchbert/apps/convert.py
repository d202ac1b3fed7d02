"""`torchbert convert`: a Google BERT or ELECTRA TensorFlow checkpoint (read by io/tf.py, without
TensorFlow) becomes a Hugging Face folder that every torchbert command and transformers read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import BertConfig
from ..heads import BertForPreTraining
from ..io.hf import check_against_weights, convert_from_hf
from ..io.tf import (CheckpointError, TFCheckpoint, bert_config_dict, electra_config, guess_lowercase, is_electra,
                     read_encoder)
from ..model import BertModel
from ..io.vocab import read_vocab
from ..tokenizer import BertTokenizer


def convert_bert(checkpoint: str | Path, config: str | Path | None = None, vocab: str | Path | None = None,
                 lowercase: bool | None = None, log=print):
    """A Google BERT or ELECTRA TensorFlow checkpoint -> (the model with its weights, BertTokenizer), all in
    memory: nothing is written here. A BERT becomes BertForPreTraining (encoder, pooler, MLM and NSP
    heads); an ELECTRA its discriminator's encoder, a BertModel without pooler. config and vocab default
    to bert_config.json (an ELECTRA's: read from its tensors' shapes when there is none) and vocab.txt
    beside the checkpoint; lowercase (do_lower_case) is guessed from the vocabulary when not given."""
    ckpt = TFCheckpoint(checkpoint)
    electra = is_electra(ckpt)
    folder = ckpt.prefix.parent
    config_path = Path(config) if config is not None else folder / "bert_config.json"
    vocab_path = Path(vocab) if vocab is not None else folder / "vocab.txt"
    if not vocab_path.is_file():
        raise CheckpointError(f"{vocab_path}: no such file (--vocab; Google's releases put it beside the checkpoint)")
    if config_path.is_file():
        cfg = BertConfig.from_dict(bert_config_dict(config_path), source=str(config_path))
    elif electra and config is None:
        cfg = BertConfig.from_dict(electra_config(ckpt), source=f"{ckpt.index} (sizes read from its tensors)")
        config_path = ckpt.index
        log(f"{ckpt.prefix}: an ELECTRA without a config: {cfg.num_hidden_layers} layers of {cfg.hidden_size}, "
            f"{cfg.num_attention_heads} heads of 64 (ELECTRA's; --config to say otherwise)")
    else:
        raise CheckpointError(f"{config_path}: no such file (--config; Google's releases put it beside the checkpoint)")
    words = read_vocab(vocab_path)
    if len(words) != cfg.vocab_size:
        raise CheckpointError(f"{vocab_path}: {len(words)} tokens, but {config_path} says vocab_size {cfg.vocab_size}")
    guessed = lowercase is None
    lowercase = guess_lowercase(words) if guessed else lowercase
    tokenizer = BertTokenizer(words, lowercase=lowercase, model_max_length=cfg.max_position_embeddings)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in read_encoder(ckpt).items()}
    try:  # before the model is built: a config of 10^13 parameters would be allocated until memory ran out
        check_against_weights(cfg, folder, ckpt.index, state, config_file=config_path)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    model = BertModel(cfg, add_pooling_layer=False) if electra else BertForPreTraining(cfg)
    try:
        ours, missing, _ = convert_from_hf(model, state, source=str(ckpt.index))
    except ValueError as e:  # a shape that disagrees with the config names the tensor
        raise CheckpointError(f"{e} (from {config_path})") from None
    model.load_state_dict(ours, strict=False)
    if missing:  # the encoder is all there (convert_from_hf checked); a release without its pretraining heads
        log(f"note: {ckpt.prefix} has no {', '.join(missing[:4])}: those heads keep a fresh initialization")
    casing = (f"{'lowercased' if lowercase else 'cased'} (guessed from the vocabulary)" if guessed
              else f"{'lowercased' if lowercase else 'cased'} (as given)")
    what = "the ELECTRA discriminator's encoder" if electra else "BERT"
    log(f"read {len(ckpt.entries)} variables of {ckpt.prefix}: {len(state)} tensors of {what}, the rest "
        f"{'the generator, the heads, ' if electra else ''}optimizer slots and counters; {casing}")
    return model.eval(), tokenizer
