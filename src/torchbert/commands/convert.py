"""read a Google BERT (or ELECTRA) TensorFlow checkpoint (no TensorFlow needed) into a Hugging Face folder

Convert one of Google's original BERT checkpoints (bert_model.ckpt.index and .data-* shards,
bert_config.json, vocab.txt: BERT-Base Chinese, multilingual, the small BERTs, whole-word masking,
and the Chinese BERTs released the same way) into a Hugging Face folder (config.json,
model.safetensors, the tokenizer) that every torchbert command and transformers read. TensorFlow is
not needed: the checkpoint's files are read directly and every checksum is verified."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..settings import Checked, add_flags, setting
from .common import check_out_folder, command, settings_from, shared_flags

WRITES_FOLDER = True
EPILOG = """\
examples:
  torchbert convert --tf-checkpoint chinese_L-12_H-768_A-12/bert_model.ckpt --out bert-base-chinese
  torchbert convert --tf-checkpoint uncased_L-4_H-256_A-4 --out bert-mini      # a folder with one checkpoint
  torchbert embed --model bert-base-chinese --input texts.txt --out vectors.npy

The output is BertForPreTraining in Hugging Face's layout (the encoder, the pooler and the MLM and NSP
heads); Adam's slots (adam_m, adam_v) and global_step are left out. An ELECTRA checkpoint (electra/...)
gives its discriminator's encoder (a BertModel; the generator and heads are left out), its sizes read
from the tensors when there is no bert_config.json; ELECTRA-Small's embedding projection is refused. A missing shard, a checksum that
does not match, a variable BERT does not have, or a shape that disagrees with bert_config.json stops
the conversion with one line naming the variable and the file, and nothing is written.
"""


@dataclass(kw_only=True)
class ConvertSettings(Checked):
    tf_checkpoint: str = setting(help="the checkpoint: its prefix (DIR/bert_model.ckpt), its .index file, or a folder "
                                      "holding one checkpoint", metavar="PATH")
    out: str = setting(help="output folder")
    config: str | None = setting(None, "bert_config.json (default: the one beside the checkpoint)")
    vocab: str | None = setting(None, "vocab.txt (default: the one beside the checkpoint)")
    lowercase: bool | None = setting(None, "whether the tokenizer lowercases (do_lower_case): Google's uncased and "
                                           "Chinese models do, cased ones do not (default: guessed from the "
                                           "vocabulary, which names no capital letters in an uncased model)")


def add(sub) -> None:
    p = command(sub, __name__)
    add_flags(p, ConvertSettings)
    shared_flags(p, "overwrite")


def run(args) -> None:
    from ..apps.convert import convert_bert
    from ..io.files import atomic_folder, check_apart
    from ..architectures import encoder_of
    from ..io.record import RunRecord, write_record

    s = settings_from(ConvertSettings, args)
    out = Path(s.out)
    check_out_folder(out, args.overwrite, [("--tf-checkpoint", s.tf_checkpoint), ("--config", s.config),
                                           ("--vocab", s.vocab)])
    check_apart(out, [("--tf-checkpoint", Path(s.tf_checkpoint).parent)])  # the shards sit beside the index
    start = time.perf_counter()
    model, tokenizer = convert_bert(s.tf_checkpoint, s.config, s.vocab, s.lowercase,
                                    log=lambda m: print(m, file=sys.stderr))
    with atomic_folder(out, marked=True) as tmp:  # the whole folder or none
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        electra = encoder_of(model) is None  # ELECTRA's discriminator: the encoder alone, as pretrain writes it
        write_record(tmp, RunRecord("convert", objective="electra" if electra else None,
                                    command=args.command_line))
    print(f"wrote {out}: {type(model).__name__}, {model.config.num_hidden_layers} layers of {model.config.hidden_size}, "
          f"a vocab of {tokenizer.vocab_size:,} ({'lowercased' if tokenizer.lowercase else 'cased'}) in "
          f"{time.perf_counter() - start:.1f}s")
