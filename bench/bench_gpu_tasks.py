"""On a CUDA GPU: fine-tuning steps and embedding, torchbert against transformers and
sentence-transformers, side by side in one process (the GPU half of issue 35; pretraining is
bench_pretrain.py --device cuda).

    python bench/bench_gpu_tasks.py --tokenizer DIR --texts FILE

BERT-base shape (L12 H768 A12) with random weights, vocab of the tokenizer's folder (a
`torchbert prepare` output holds one), real text (one paragraph per line; People's Daily here),
the same weights in every system (torchbert's, written with save_pretrained).

Fine-tuning (bf16 autocast over fp32 weights, fused AdamW, clipping at 1.0, dropout on):
  * sequence classification: batches of 32 paragraphs cut at 128 tokens, in the data's order,
    2 random labels;
  * extractive QA: batches of 32 (question, paragraph) pairs cut at 384 tokens, the question the
    paragraph's first 12 characters, the answer a random span of the paragraph.
  torchbert takes the packed batch with the training loop's pieces (fast.training: FlashAttention's
  varlen kernel; the verdict left on the device: clipped_step(defer=True)); transformers
  (attn_implementation="sdpa") the batch padded to its longest (a DataCollatorWithPadding), and
  steps as its Trainer does (clip_grad_norm_, then step).

Embedding (inference, bf16 autocast as `torchbert serve --precision bf16` runs): every text, mean
pooled and normalized, batches of 128 texts; torchbert's `embed_ids` (length-sorted packed
batches) with its attention plain (SDPA) and fast (fast.inference: FlashAttention's varlen kernel),
against sentence-transformers on the same folder (its own length sorting and padding). Embeddings
must agree within 2e-2 (bf16).

Time: torch.cuda.synchronize() around a second pass over the fine-tuning batches (the first pass is
warm-up: every batch shape seen once, as in a run of several epochs), and the best of 3 full
passes after a warm-up pass (embedding)."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from torchbert import BertConfig, fast
from torchbert.features import embed_ids
from torchbert.heads import BertForQuestionAnswering, BertForSequenceClassification
from torchbert.model import BertModel
from torchbert.packing import pack
from torchbert.tokenizer import BertTokenizer
from torchbert.train.optim import clipped_step, make_optimizer

DEV = torch.device("cuda")


def step(model, optimizer, inputs: dict, ours: bool) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**inputs).loss
    loss.backward()
    if ours:
        clipped_step(optimizer, model.parameters(), 1.0, loss=loss.detach(), defer=True)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed_steps(model, inputs: list[dict], ours: bool) -> float:
    torch.manual_seed(0)
    optimizer = make_optimizer(model, lr=2e-5)
    with contextlib.ExitStack() as applied:
        if ours:
            applied.enter_context(fast.training(model))
        for x in inputs:  # a first pass: every batch shape seen once (cuDNN's attention plans one per shape)
            step(model, optimizer, x, ours)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for x in inputs:
            step(model, optimizer, x, ours)
        torch.cuda.synchronize()
    return time.perf_counter() - start


def finetune_batches(tok: BertTokenizer, texts: list[str], task: str, B: int, count: int, rng) -> list:
    """(packed inputs, padded inputs, real tokens) per batch."""
    out = []
    T = 128 if task == "cls" else 384
    for k in range(count):
        chunk = texts[k * B:(k + 1) * B]
        if task == "cls":
            seqs = tok.encode_ids(chunk, max_length=T, truncation=True)
            types = [[0] * len(s) for s in seqs]
        else:
            seqs, types = [], []
            for text in chunk:
                q = tok.encode_ids([text[:12]])[0]
                c = tok.encode_ids([text])[0][1:][: T - len(q)]
                seqs.append(q + c)
                types.append([0] * len(q) + [1] * len(c))
        ids, cu, longest = pack(seqs)
        tt, _, _ = pack(types)
        lengths = [len(s) for s in seqs]
        padded = torch.zeros(len(seqs), longest, dtype=torch.long)
        ptypes, mask = torch.zeros_like(padded), torch.zeros_like(padded)
        for i, (s, t) in enumerate(zip(seqs, types)):
            padded[i, :len(s)], ptypes[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), torch.tensor(t), 1
        if task == "cls":
            labels = torch.from_numpy(rng.integers(0, 2, len(seqs)))
            extra = {"labels": labels}
        else:
            starts = torch.tensor([int(rng.integers(n // 2, n - 1)) for n in lengths])
            extra = {"start_positions": starts, "end_positions": starts + 1}
        on = lambda d: {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in d.items()}  # noqa: E731
        out.append((on({"input_ids": ids, "token_type_ids": tt, "cu_seqlens": cu, "max_seqlen": longest, **extra}),
                    on({"input_ids": padded, "token_type_ids": ptypes, "attention_mask": mask, **extra}),
                    sum(lengths)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with tokenizer.json/vocab.txt")
    ap.add_argument("--texts", type=Path, required=True, help="one text per line")
    ap.add_argument("--steps", type=int, default=20, help="timed fine-tuning steps per system (default 20)")
    ap.add_argument("--embed", type=int, default=20000, help="texts to embed (default 20000)")
    args = ap.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    tok = BertTokenizer.from_pretrained(args.tokenizer)
    texts = [line for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip()]
    config = BertConfig.from_name("base", vocab_size=tok.vocab_size)
    rng = np.random.default_rng(0)
    print(f"# {time.strftime('%Y-%m-%d')}; {torch.cuda.get_device_name()}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; BERT-base shape, vocab {tok.vocab_size}; {len(texts):,} texts")
    with tempfile.TemporaryDirectory(prefix="bench_gpu_tasks.") as tmp:
        work = Path(tmp)
        print("\n| fine-tuning step (bf16, batch 32) | real tokens/step | torchbert ms/step | transformers ms/step "
              "| torchbert speed-up |")
        print("|---|---:|---:|---:|---:|")
        for task, ours_cls, theirs_name in (("cls", BertForSequenceClassification, "BertForSequenceClassification"),
                                            ("qa", BertForQuestionAnswering, "BertForQuestionAnswering")):
            torch.manual_seed(0)
            ours_cls(config).save_pretrained(work / task)
            batches = finetune_batches(tok, texts, task, 32, args.steps, rng)
            ours = ours_cls.from_pretrained(work / task).to(DEV).train()
            t_ours = timed_steps(ours, [b[0] for b in batches], True)
            theirs = getattr(transformers, theirs_name).from_pretrained(
                work / task, attn_implementation="sdpa", dtype=torch.float32).to(DEV).train()
            t_theirs = timed_steps(theirs, [b[1] for b in batches], False)
            real = sum(b[2] for b in batches) / args.steps
            label = "sequence classification (<= 128 tokens)" if task == "cls" else "extractive QA (<= 384 tokens)"
            print(f"| {label} | {real:,.0f} | {t_ours / args.steps * 1e3:.1f} | {t_theirs / args.steps * 1e3:.1f} "
                  f"| {t_theirs / t_ours:.2f}x |")
            del ours, theirs
            torch.cuda.empty_cache()
        embed_table(config, tok, texts[: args.embed], work)


def embed_table(config: BertConfig, tok: BertTokenizer, texts: list[str], work: Path) -> None:
    from sentence_transformers import SentenceTransformer, models

    torch.manual_seed(0)
    BertModel(config).save_pretrained(work / "enc")
    tok.save_pretrained(work / "enc")
    ids = tok.encode_ids(texts, max_length=512, truncation=True)
    tokens = sum(len(x) for x in ids)
    ours = BertModel.from_pretrained(work / "enc").to(DEV).eval()

    def run_ours():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return embed_ids(ours, ids, pooling="mean", normalize=True, batch_size=128)

    word = models.Transformer(str(work / "enc"), max_seq_length=512)
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean"),
                                      models.Normalize()], device="cuda")

    def run_st():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return st.encode(texts, batch_size=128, convert_to_numpy=True)

    def best(fn):
        fn()  # warm-up
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return min(times), out

    t_plain, e_plain = best(run_ours)
    with fast.inference(ours):
        t_fast, e_fast = best(run_ours)
    t_st, e_st = best(run_st)
    diff = max(float(np.abs(e_fast - e_plain).max()), float(np.abs(e_st - e_plain).max()))
    print(f"\nembedding {len(texts):,} texts ({tokens / len(texts):.0f} tokens on average, up to 512), mean pooled, "
          f"bf16 autocast, batches of 128; largest difference between systems {diff:.1e}")
    print("| system | texts/s | tokens/s | torchbert (fast) speed-up |")
    print("|---|---:|---:|---:|")
    for name, t in (("torchbert, packed, flash varlen (fast.inference)", t_fast), ("torchbert, packed, SDPA", t_plain),
                    ("sentence-transformers (transformers sdpa, padded)", t_st)):
        print(f"| {name} | {len(texts) / t:,.0f} | {tokens / t:,.0f} | {t / t_fast:.2f}x |")
    if diff > 2e-2:
        print(f"WARNING: embeddings differ by {diff:.1e} > 2e-2")


if __name__ == "__main__":
    main()
