"""The benchmarks run end to end at toy sizes, and their side-by-side checks hold (nothing is timed here).

A benchmark is run rarely and by hand; these catch one that no longer runs against the code it measures.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # whole commands end to end: `bash scripts/test.sh --fast` leaves them out

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def table_rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| system")]


def test_bench_pretrain_runs_both_systems_on_equal_losses():
    out = run_bench("bench_pretrain.py", "--config", "tiny", "--steps", "1", "--batch-size", "4", "--seq-len", "32",
                    "--vocab-size", "8000", "--regime", "variable")
    diff = re.search(r"max abs loss difference vs torchbert \(eval, same first batch\): (\S+)", out)
    assert diff and float(diff.group(1)) < 1e-4, out
    rows = table_rows(out)
    assert [r[0].split(",")[0] for r in rows] == ["torchbert", "transformers sdpa"], out
    assert rows[0][4] == "1.00x"
    ours, theirs = (float(r[3].replace(",", "")) for r in rows)  # real tokens/s
    # the speed-up is their ratio, to the rounding of the printed figures (whole tokens/s, two decimals)
    rounding = ours / theirs * (0.5 / ours + 0.5 / theirs) + 0.005
    assert float(rows[1][4].rstrip("x")) == pytest.approx(ours / theirs, abs=rounding + 1e-9)
    assert re.search(r"fp32 matmul peak .*: [\d.]+ GFLOP/s", out)


def test_bench_pretrain_profiles_every_system_it_times():
    out = run_bench("bench_pretrain.py", "--config", "tiny", "--steps", "1", "--batch-size", "4", "--seq-len", "32",
                    "--vocab-size", "8000", "--regime", "variable", "--plain", "--profile", "3")
    rows = table_rows(out)
    assert len(rows) == 3, out  # torchbert, its plain model, transformers
    profiled = re.findall(r"profile of one step, (.+?): top 3 ops by self CPU time", out)
    assert profiled == [r[0] for r in rows] and out.count("Self CPU time total") == 3, out


def test_bench_finetune_starts_both_systems_equal_and_judges_the_target():
    out = run_bench("bench_finetune.py", "--task", "ner", "--train-size", "16", "--dev-size", "8", "--epochs", "1",
                    "--batch-size", "8", "--bootstrap", "50")
    assert "untrained, the two models' dev predictions: 100.0% of dev word tags equal" in out, out
    rows = table_rows(out)
    systems = [r[0] for r in rows if r[0].startswith(("torchbert", "transformers"))]
    assert systems == ["torchbert finetune (packed)", "transformers, padded to longest"], out
    # the same real tokens trained on both sides; transformers also feeds padding
    ours, theirs = (r for r in rows if r[0] in systems)
    assert ours[6] == theirs[6] and int(ours[7].replace(",", "")) < int(theirs[7].replace(",", ""))
    assert re.search(r"target \(dev f1 within noise or better, train time <= 0\.5x\): (NOT )?MET", out), out


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "en_qa_disfl").is_dir(),
                    reason="needs ../shared/data (CI has it beside the clone)")
def test_bench_finetune_qa_prepares_both_systems_the_same_windows():
    """transformers' side (run_qa's preparation with torchbert's windows) trains on the same tokens and, from
    the same head, finds the same best span for every dev question."""
    out = run_bench("bench_finetune.py", "--task", "qa", "--train-size", "16", "--dev-size", "8", "--epochs", "1",
                    "--batch-size", "8", "--bootstrap", "50", "--max-length", "128")
    assert "untrained, the two models' dev predictions: 100.0% of dev best spans equal" in out, out
    rows = table_rows(out)
    ours, theirs = (r for r in rows if r[0].startswith(("torchbert", "transformers")))
    assert ours[6] == theirs[6], out  # the same real tokens trained on: the same windows and the same epochs
    assert re.search(r"torchbert finetune \(packed\) HasAns F1 \d\.\d{4}, NoAns F1 \d\.\d{4}; transformers", out)
    assert re.search(r"target \(dev f1 within noise or better, train time <= 0\.5x\): (NOT )?MET", out), out


def test_bench_serve_loads_both_servers_and_their_answers_agree():
    out = run_bench("bench_serve.py", "--clients", "1", "2", "--requests", "6", "--threads", "1", "--repeats", "2")
    rows = table_rows(out)
    assert [(r[0].split(" (")[0], r[1]) for r in rows] == [("torchbert serve", "1"), ("torchbert serve", "2"),
                                                           ("naive", "1"), ("naive", "2")], out
    assert all(float(r[-1]) < 1e-5 for r in rows) and all(float(r[2]) > 0 for r in rows)


def test_bench_int8_times_four_systems_and_scores_both_tasks_in_fp32_and_int8():
    out = run_bench("bench_int8.py", "--n", "8", "--corpus", "sentences", "--repeats", "1", "--threads", "1",
                    "--ner-train-size", "16", "--sentiment-train-size", "16", "--dev-size", "8", "--test-size", "8")
    rows = table_rows(out)
    speed = {r[0]: r for r in rows if r[0].startswith(("transformers", "torchbert"))}
    assert list(speed) == ["transformers fp32 (naive, sdpa)", "torchbert fp32", "torchbert onnx fp32",
                           "torchbert --int8"], out
    assert float(speed["transformers fp32 (naive, sdpa)"][4]) > 0.9999  # min cosine to torchbert fp32
    assert float(speed["torchbert onnx fp32"][4]) > 0.9999 and 0.9 < float(speed["torchbert --int8"][3]) < 1
    quality = [r for r in rows if r[0] in ("ner", "sentiment")]
    assert [(r[0], r[2]) for r in quality] == [("ner", "f1"), ("sentiment", "accuracy")], out
    assert 0 < int(quality[0][1]) <= 8 and quality[1][1] == "8"  # NER: test tweets with unseen tags go to train
    assert all(0 <= float(r[3]) <= 1 and 0 <= float(r[4]) <= 1 for r in quality)


def test_bench_cpu_runtimes_runs_every_system_it_has_on_the_same_texts():
    """onnxruntime comes with torchbert; openvino is bench-only: its row, or the note that leaves it out."""
    out = run_bench("bench_cpu_runtimes.py", "--n", "24", "--repeats", "1", "--threads", "1", "--calibration", "8",
                    "--systems", "sentence-transformers-fp32", "onnxruntime-fp32", "onnxruntime-int8", "openvino-fp32",
                    "torchbert-fp32", "torchbert-default", "torchbert-int8")
    rows = {r[0]: r for r in table_rows(out)}
    has_openvino = "openvino-fp32" in rows
    assert has_openvino != ("openvino rows left out" in out), out
    assert list(rows) == ["sentence-transformers-fp32", "onnxruntime-fp32", "onnxruntime-int8",
                          *(["openvino-fp32"] if has_openvino else []), "torchbert-fp32", "torchbert-default",
                          "torchbert-int8"], out
    for name in ("sentence-transformers-fp32", "onnxruntime-fp32", "torchbert-fp32", "torchbert-default",
                 *(["openvino-fp32"] if has_openvino else [])):  # fp32 everywhere here, or bf16 within 0.999
        assert float(rows[name][6]) > 0.999 and float(rows[name][7]) > 0.9, (name, out)
    assert 0.9 < float(rows["onnxruntime-int8"][5]) < 1 and 0.9 < float(rows["torchbert-int8"][5]) < 1, out
    assert "# probe (GFLOP/s, 256 x 384 x 1536): fp32 " in out and "# torchbert default: " in out


def test_bench_precision_times_every_system_and_scores_every_precision(tmp_path):
    out = run_bench("bench_precision.py", "--part", "speed", "training", "quality", "--n", "8", "--repeats", "1",
                    "--bf16", "--threads", "1", "--seeds", "0", "--ner-train-size", "16", "--sentiment-train-size", "8",
                    "--dev-size", "8", "--test-size", "8", "--pairs", "8", "--queries", "8", "--no-qa",
                    "--work", str(tmp_path))
    rows = {r[0]: r for r in table_rows(out)}
    assert [n for n in rows if n.startswith(("sentence", "torchbert"))] == [
        "sentence-transformers fp32", "sentence-transformers bf16 weights", "torchbert fp32",
        "torchbert bf16 under autocast", "torchbert bf16 (--precision bf16)", "torchbert --int8"], out
    assert float(rows["torchbert fp32"][5]) == 1.0 and float(rows["sentence-transformers fp32"][5]) > 0.9999
    assert float(rows["torchbert bf16 (--precision bf16)"][5]) > 0.999  # the bound of bf16 inference
    assert rows["ner"][2] == "f1" and rows["sentiment"][2] == "accuracy", out
    assert {r[0] for r in table_rows(out)} >= {"fp32", "bf16", "int8"}  # the retrieval rows
    training = [r for r in table_rows(out) if r[1] in ("fp32", "bf16") and r[0].startswith(("sentiment", "embedding"))]
    assert [(r[0].split()[0], r[1]) for r in training] == [("sentiment", "fp32"), ("sentiment", "bf16"),
                                                           ("embedding", "fp32"), ("embedding", "bf16")], out


def test_bench_precision_leaves_the_bf16_rows_out_with_no_bf16():  # the default where the CPU emulates bf16
    out = run_bench("bench_precision.py", "--part", "speed", "--n", "8", "--repeats", "1", "--threads", "1",
                    "--no-bf16")
    rows = {r[0]: r for r in table_rows(out)}
    assert list(rows) == ["sentence-transformers fp32", "torchbert fp32", "torchbert --int8"], out
    assert float(rows["torchbert fp32"][4]) == 1.0 and float(rows["sentence-transformers fp32"][4]) > 0.9999
    assert "bf16 rows left out (--bf16 times them)" in out and "bf16 GFLOP/s" not in out


def test_bench_learning_scores_both_systems_on_the_same_heldout_masks(tmp_path):
    out = run_bench("bench_learning.py", "--budget", "quick", "--work", str(tmp_path), "--steps", "4", "--batch-size",
                    "4", "--warmup", "1", "--eval-every", "2", "--eval-batches", "2")
    sticks = re.search(r"count yardsticks on (\d+) held-out masked tokens: unigram ([\d.]+), left ([\d.]+), "
                       r"both neighbours ([\d.]+)", out)
    assert sticks and int(sticks[1]) > 0
    rows = table_rows(out)
    steps = [r for r in rows if r[0][0].isdigit()]
    assert [r[0] for r in steps] == ["0", "2", "4"]
    assert all(0 <= float(r[i]) <= 1 for r in steps for i in (2, 3))
    # step 0: the same start weights on the same masks, so the same score (a tied argmax may flip a token)
    assert abs(float(steps[0][2]) - float(steps[0][3])) <= 1.5 / int(sticks[1])
    final = re.search(r"final held-out MLM accuracy: torchbert ([\d.]+), transformers ([\d.]+)", out)
    assert final and (final[1], final[2]) == (steps[-1][2], steps[-1][3])


def test_bench_recipes_runs_each_probe_for_its_seconds_and_tables_it(tmp_path):
    probes = ("paper", "GPT", "GPT, pre-LN")  # the variants themselves: the next test
    out = run_bench("bench_recipes.py", "--budget", "quick", "--work", str(tmp_path), "--probes", *probes,
                    "--seconds", "2", "--seeds", "0", "--evals", "2")
    rows = {r[0].removesuffix(" (next token)"): r for r in table_rows(out)}
    assert set(rows) >= set(probes)
    assert rows["paper"][-1] == "+0.000" and rows["GPT"][-1] == "+0.000"  # GPT's probes: against GPT
    for name in probes:
        assert 0 <= float(rows[name][-2]) <= 1 and int(rows[name][1].replace(",", "")) >= 10
    results = __import__("json").loads((tmp_path / "results.json").read_text())
    assert set(results["2s"]) == set(probes)
    assert (tmp_path / "models" / "GPT-pre-LN-seed0" / "model.safetensors").is_file()


def test_bench_recipes_gpt_variants_are_what_they_say_and_leave_gpt_as_it_was():
    """The probe-only GPT architectures: rotary positions read no position table; pre-LN normalizes
    before each block; both are patched in for the block only."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_recipes import gpt_variant

    from torchbert import model as m
    from torchbert.baselines.gpt import OpenAIGPTModel
    from torchbert.config import GPTConfig

    torch.manual_seed(0)
    gpt = OpenAIGPTModel(GPTConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)).eval()
    ids, cu = torch.randint(0, 50, (12,)), torch.tensor([0, 5, 12])
    plain = gpt(ids, cu_seqlens=cu, max_seqlen=7).last_hidden_state
    with gpt_variant("rotary"):
        rotary = gpt(ids, cu_seqlens=cu, max_seqlen=7).last_hidden_state
        table = gpt.embeddings.positions.weight.detach().clone()
        with torch.no_grad():
            gpt.embeddings.positions.weight.mul_(5)  # the table is not read
        assert torch.equal(gpt(ids, cu_seqlens=cu, max_seqlen=7).last_hidden_state, rotary)
        # a causal model: the first sequence's states do not depend on its later tokens
        later = ids.clone()
        later[3:5] = (later[3:5] + 1) % 50
        assert torch.allclose(gpt(later, cu_seqlens=cu, max_seqlen=7).last_hidden_state[:3], rotary[:3])
    with torch.no_grad():
        gpt.embeddings.positions.weight.copy_(table)
    with gpt_variant("pre-ln"):
        pre = gpt(ids, cu_seqlens=cu, max_seqlen=7).last_hidden_state
        x = gpt.embeddings(ids[:5], torch.arange(5))
        for layer in gpt.layers:  # x + attn(LN(x)), then x + FFN(LN(x)), written out for the first sequence
            from torchbert.packing import Layout

            a, _ = layer.attention(layer.attention_norm(x[None]), Layout(1, 5, None, causal=True))
            x = x + a[0]
            x = x + layer.ffn(layer.ffn_norm(x))
        assert torch.allclose(pre[:5], torch.nn.functional.layer_norm(x, (32,)), atol=1e-5)
    assert not torch.allclose(pre, plain) and not torch.allclose(rotary, plain)
    assert torch.equal(gpt(ids, cu_seqlens=cu, max_seqlen=7).last_hidden_state, plain)  # as it was
    assert m.Layer.forward.__name__ == "forward"


def test_bench_retrieval_scores_every_model_on_the_chinese_set():
    out = run_bench("bench_retrieval.py", "--queries", "40", "--max-length", "64")
    assert "People's Daily ICT (zh): 40 queries, 40 passages" in out
    rows = [r for r in table_rows(out) if r[0] != "model" and not r[0].startswith("---")]
    assert {r[0] for r in rows} >= {"MiniLM-L6 (all-MiniLM-L6-v2)", "random weights, MiniLM's shape"}
    for r in rows:
        ndcg = float(r[2].split(" ± ")[0])
        assert 0 <= ndcg <= 1 and float(r[6]) >= float(r[5]) >= float(r[4])  # recall grows with k


def test_bench_embedding_training_runs_both_trainers_and_judges_the_target():
    out = run_bench("bench_embedding_training.py", "--pairs", "64", "--queries", "24", "--seeds", "0",
                    "--max-length", "48")
    rows = [r for r in table_rows(out) if r[0] in ("torchbert", "sentence-transformers")]
    assert [r[0] for r in rows[:2]] == ["torchbert", "sentence-transformers"]  # seed 0: torchbert first
    for r in rows[:2]:
        assert float(r[2]) > 0 and 0 <= float(r[3]) <= 1
    assert re.search(r"torchbert's time / sentence-transformers': \d+\.\d\dx \(target <= 0\.5x\)", out)


def test_bench_simcse_trains_on_raw_sentences_and_reports_the_gain_in_standard_errors(tmp_path):
    from clihelp import tiny_bert

    import realdata

    base = tiny_bert(tmp_path / "base", realdata.minilm_dir())
    out = run_bench("bench_simcse.py", "--model", str(base), "--seeds", "0", "--sentences", "200", "--batch-size", "16",
                    "--max-length", "32")
    assert re.search(r"raw \(mean pooling\): nDCG@10 0\.\d{3} ± 0\.\d{3} \(SE\)", out)
    rows = [r for r in table_rows(out) if r[0] == "0.0001"]
    assert [r[1] for r in rows] == ["0", "mean ± std"] and re.fullmatch(r"[+-]\d+\.\d", rows[0][4])


def test_bench_sparse_scores_the_mlm_heads_vectors_and_a_bag_of_words(tmp_path):
    from clihelp import tiny_bert

    import realdata

    base = tiny_bert(tmp_path / "base", realdata.minilm_dir())
    out = run_bench("bench_sparse.py", "--model", str(base), "--queries", "30")
    rows = [r for r in table_rows(out) if r[0] == str(base)]
    assert [r[1] for r in rows] == ["MLM head, max log(1+ReLU)", "idf-weighted bag of its tokens"]
    assert all(0 <= float(r[2].split(" ± ")[0]) <= 1 for r in rows)


def test_bench_rerank_trains_a_reranker_and_reorders_the_first_stage(tmp_path):
    from clihelp import tiny_bert

    import realdata

    base = tiny_bert(tmp_path / "base", realdata.minilm_dir())
    out = run_bench("bench_rerank.py", "--model", str(base), "--queries", "30", "--pairs", "48", "--top", "5",
                    "--hard", "1")
    rows = table_rows(out)
    assert [r[0].split(" (")[0] for r in rows if r[0] != "search"] == ["idf-weighted bag of tokens", "+ reranker"]
    assert re.search(r"the passage is among the top 5 for \d+\.\d% of the queries", out)


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "en_nli_presup").is_dir(),
                    reason="needs ../shared/data (CI has it beside the clone)")
def test_bench_suite_runs_the_benchmark_and_the_trainer_on_the_same_protocol(tmp_path):
    out = run_bench("bench_suite.py", "--work", str(tmp_path), "--tasks", "MNLI", "--max-train", "24", "--seeds", "1",
                    "--lrs", "1e-4", "--threads", "1")
    assert re.search(r"\| MNLI-m \| \d+\.\d\d \| \d+\.\d\d \| [+-]\d+\.\d\d \|", out)
    assert re.search(r"time: torchbert \d+ s .* transformers \d+ s .*\*\*\d\.\d\dx\*\*", out)
    assert (tmp_path / "glue_data" / "MNLI" / "dev_matched.tsv").read_text().splitlines()[0].endswith("gold_label")


def test_bench_continue_fine_tunes_minilm_as_it_came_and_continued_on_the_tasks_and_the_domains_text():
    out = run_bench("bench_continue.py", "--tasks", "reviews", "--seeds", "1", "2", "--steps", "2", "--batch-size",
                    "4", "--train-size", "24", "--dev-size", "16", "--dapt-size", "40", "--epochs", "1",
                    "--max-length", "32", "--extend", "50")
    assert int(re.search(r"reviews: ([\d,]+) of the domain text's words added", out)[1].replace(",", "")) > 0
    rows = {r[1]: r for r in table_rows(out) if r[0].startswith("reviews")}
    assert set(rows) == {"direct (as shipped)", "direct", "TAPT", "DAPT"}
    for name in ("direct (as shipped)", "direct"):  # nothing continued, nothing scored before
        assert rows[name][3] == "-"
    assert rows["direct (as shipped)"][2] == "0"
    for name in ("TAPT", "DAPT"):
        before, after = (float(x) for x in rows[name][3].split(" → "))
        assert 0 <= before <= 1 and 0 <= after <= 1
    for r in rows.values():
        mean, se = (float(x) for x in r[4].split(" ± "))  # two seeds: a mean and its standard error
        assert 0 <= mean <= 1 and se >= 0
