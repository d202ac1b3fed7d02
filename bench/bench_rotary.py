"""What rotary positions cost per training step: tiny BERTs with learned and with rotary positions,
the same batches of the demo's data, timed in turns in one process (fast.training, as pretrain trains).

    python bench/bench_rotary.py DATA        # DATA: a torchbert prepare folder
"""

import sys
import time

import torch

from torchbert import BertConfig, fast
from torchbert.data.shards import PretrainingData
from torchbert.heads import BertForPreTraining


def main() -> None:
    torch.set_num_threads(1)
    data = PretrainingData(sys.argv[1])
    batches = [b for _, b in zip(range(10), data.batches(32))]
    models = {}
    for pos in ("absolute", "rotary"):
        torch.manual_seed(0)
        cfg = BertConfig.from_name("tiny", vocab_size=data.vocab_size, position_embedding_type=pos)
        m = BertForPreTraining(cfg).train()
        models[pos] = (m, torch.optim.AdamW(m.parameters(), lr=1e-3))
    times = {k: 0.0 for k in models}
    for r in range(4):  # in turns; the first round warms up and is not counted
        for pos, (m, opt) in models.items():
            with fast.training(m):
                t = time.perf_counter()
                for b in batches:
                    out = m(b.input_ids, token_type_ids=b.token_type_ids, cu_seqlens=b.cu_seqlens,
                            max_seqlen=b.max_seqlen, mlm_positions=b.mlm_positions, mlm_labels=b.mlm_labels,
                            next_sentence_label=b.nsp_labels)
                    out.loss.backward()
                    opt.step()
                    opt.zero_grad()
                if r:
                    times[pos] += time.perf_counter() - t
    print(f"30 steps of 32 x 128 each, 1 thread: learned positions {times['absolute']:.2f} s, rotary "
          f"{times['rotary']:.2f} s; rotary / learned {times['rotary'] / times['absolute']:.3f}")


if __name__ == "__main__":
    main()
