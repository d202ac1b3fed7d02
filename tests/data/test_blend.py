"""Several data folders read as one at their weights (data/blend.py; `pretrain --data news:0.7 wiki:0.3`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from clihelp import cli

from torchbert.data.blend import BlendedData, open_data, parse_data
from torchbert.data.shards import PretrainingData


def blend(prepared, weights=(0.7, 0.3), names=("data", "eval"), **kw) -> BlendedData:
    return open_data([(prepared / n, w) for n, w in zip(names, weights)], **kw)


def folder_keys(data: BlendedData, epochs: int) -> list[list[int]]:
    """Per folder, the instance indices it gave, in the order drawn over `epochs` blend epochs."""
    got = [[] for _ in data.parts]
    for e in range(epochs):
        for key in data.order(e):
            i, local = data.locate(key)
            got[i].append(local)
    return got


def test_parse_data():
    assert parse_data(["a"]) == [(Path("a"), None)]
    assert parse_data(["news:0.7", "wiki:0.3"]) == [(Path("news"), 0.7), (Path("wiki"), 0.3)]
    assert parse_data(["run:2/data:3"]) == [(Path("run:2/data"), 3.0)]  # the last colon and a number: a weight
    assert parse_data(["a:b"]) == [(Path("a:b"), None)]  # a colon followed by no number belongs to the name
    for bad, message in ((["a:0"], "must be a number > 0"), (["a:-1"], "must be a number > 0"),
                         (["a:nan"], "must be a number > 0"), (["a:1", "./a:2"], "given twice"),
                         (["a:1", "b"], r"every folder a weight \(FOLDER:WEIGHT\) or none"),
                         ([], "give a data folder")):
        with pytest.raises(ValueError, match=message):
            parse_data(bad)


def test_weights_out_of_the_ordinary(prepared, monkeypatch):
    monkeypatch.chdir(prepared)  # data/ is a folder here: data:abc means a weight, mistyped
    with pytest.raises(ValueError, match="--data data:abc: the weight after ':' must be a number > 0, got 'abc'"):
        parse_data(["data:abc", "eval:1"])
    huge = blend(prepared, (1e308, 1e308), seed=4)  # their sum overflows; their ratio is 1
    assert huge.draws.tolist() == blend(prepared, (0.5, 0.5), seed=4).draws.tolist()


def test_each_folder_is_drawn_at_its_weight_and_whole_before_it_repeats(prepared):
    data = blend(prepared, (0.5, 0.5), seed=4)
    sizes = [len(p) for p in data.parts]
    assert len(data) == sum(sizes)
    assert data.draws.sum() == len(data) and abs(data.draws[0] - 0.5 * len(data)) <= 1
    assert data.draws[1] > 2 * sizes[1] and data.draws[0] < sizes[0]  # "eval" upsampled, "data" read in part
    got = folder_keys(data, 3)
    for i, keys in enumerate(got):
        assert len(keys) == 3 * data.draws[i]
        for start in range(0, len(keys) - sizes[i] + 1, sizes[i]):  # each of its own epochs: every instance once
            assert sorted(keys[start:start + sizes[i]]) == list(range(sizes[i]))
        own = PretrainingData(data.parts[i].folder, seed=4)
        assert keys[:sizes[i]] == own.order(0).tolist()  # in the folder's own order
    # the folders' draws are spread through the epoch: each quarter holds them near their weights
    which = np.array([data.locate(k)[0] for k in data.order(0)])
    for quarter in np.array_split(which, 4):
        assert abs((quarter == 0).mean() - 0.5) < 0.1
    assert (data.order(1) != data.order(0)).any()
    # without weights each folder counts by its instances: the folders end to end, shuffled
    natural = open_data([(prepared / "data", None), (prepared / "eval", None)], seed=4)
    assert natural.draws.tolist() == sizes
    assert [sorted(k) for k in folder_keys(natural, 1)] == [list(range(n)) for n in sizes]


def test_batches_are_the_folders_instances_resumable_and_split_across_ranks(prepared):
    data = blend(prepared, seed=1)
    batches = list(data.batches(8))
    assert len(batches) == data.batches_per_epoch(8) == len(data) // 8
    order = data.order(0)
    for b, start in ((batches[0], 0), (batches[5], 40)):
        expected = [data.instance(k) for k in order[start:start + 8]]
        assert b.input_ids.shape[0] == sum(len(it["tokens"]) for it in expected)
        labels = np.concatenate([it["tokens"] for it in expected])[b.mlm_positions.numpy()]
        assert (b.mlm_labels.numpy() == labels).all()  # static masks: the folder's own
        assert b.nsp_labels.tolist() == [int(it["random_next"]) for it in expected]
    i, local = data.locate(order[0])  # the same batch as its folder alone gives for that instance
    alone = data.parts[i].batch([local])
    first = data.batch(order[:1])
    assert (first.input_ids == alone.input_ids).all() and (first.mlm_positions == alone.mlm_positions).all()
    resumed = list(data.batches(8, start=7))
    assert len(resumed) == len(batches) - 7
    assert all((a.input_ids == b.input_ids).all() for a, b in zip(resumed, batches[7:]))
    ranks = [list(blend(prepared, seed=1, rank=r, world_size=2).batches(4)) for r in (0, 1)]
    for g, (r0, r1) in enumerate(zip(*ranks)):  # global batch g of 8 = rank 0's 4, then rank 1's 4
        whole = data.batch(order[g * 8:g * 8 + 8])
        assert (whole.input_ids == np.concatenate([r0.input_ids, r1.input_ids])).all()


def test_an_upsampled_instance_is_masked_afresh_each_time_it_is_drawn(prepared, tmp_path):
    for name in ("a", "b"):
        assert cli_ok("prepare", "--corpus", prepared / "train.txt", "--tokenizer", prepared / "tok", "--out",
                      tmp_path / name, "--max-seq-len", "64", "--dupe-factor", "1", "--masking", "dynamic",
                      "--seed", {"a": "0", "b": "1"}[name], "--quiet")
    data = open_data([(tmp_path / "a", 0.9), (tmp_path / "b", 0.1)], seed=0)
    assert data.draws[0] > 1.5 * data.sizes[0]
    keys = data.order(0)
    first = next(k for k in keys if data.locate(k) == (0, 0))
    again = next(k for k in keys if data.locate(k) == (0, 0) and k != first)
    one, two = data.batch([first]), data.batch([again])
    assert (one.mlm_labels.sum() > 0) and not (one.mlm_positions.shape == two.mlm_positions.shape
                                               and (one.mlm_positions == two.mlm_positions).all())
    assert (data.batch([first]).input_ids == one.input_ids).all()  # a pure function of (seed, epoch, key)
    later = data.batch([first], epoch=1)  # the next blend epoch masks it afresh too
    assert not (later.mlm_positions.shape == one.mlm_positions.shape and (later.mlm_positions == one.mlm_positions).all())
    # the count tables read each folder's first tokens at its weight
    arrays = list(data.token_arrays(1000))
    assert sum(len(a) for a in arrays) == 1000


def cli_ok(*argv) -> bool:
    from torchbert.cli import main

    return main([str(a) for a in argv]) == 0


def test_folders_that_cannot_be_blended_are_refused(prepared, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(prepared / "eval", other)
    manifest = json.loads((other / "manifest.json").read_text(encoding="utf-8"))
    (other / "manifest.json").write_text(json.dumps({**manifest, "vocab_sha256": "0" * 64}), encoding="utf-8")
    with pytest.raises(ValueError, match=f"--data {other}: prepared with another vocabulary than"):
        open_data([(prepared / "data", 1.0), (other, 1.0)])
    settings = {**manifest["settings"], "masking": "dynamic"}
    (other / "manifest.json").write_text(json.dumps({**manifest, "settings": settings}), encoding="utf-8")
    with pytest.raises(ValueError, match="prepared with masking 'dynamic', .* with 'static'"):
        open_data([(prepared / "data", 1.0), (other, 1.0)])
    # another max_seq_len blends: the blend's is the longest
    assert open_data([(prepared / "data", 1.0), (prepared / "data128", 1.0)]).max_seq_len == 128


def test_pretrain_on_a_blend(prepared, tmp_path, capsys):
    for name, corpus in (("news", "train.txt"), ("wiki", "eval.txt")):
        assert cli_ok("prepare", "--corpus", prepared / corpus, "--tokenizer", prepared / "tok", "--out",
                      tmp_path / name, "--max-seq-len", "64", "--dupe-factor", "1", "--masking", "dynamic",
                      "--heldout-docs", "5", "--quiet")
    run = tmp_path / "run"
    argv = ["pretrain", "--data", f"{tmp_path / 'news'}:0.7", f"{tmp_path / 'wiki'}:0.3", "--out", run, "--config",
            "tiny", "--batch-size", "8", "--steps", "3", "--eval-batches", "2", "--quiet", "--device", "cpu"]
    code, out, err = cli(capsys, *argv)
    assert code == 0, err
    summary = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    assert [(Path(b["folder"]).name, round(b["weight"], 3)) for b in summary["data"]] == [("news", 0.7),
                                                                                        ("wiki", 0.3)]
    assert "mlm_accuracy" in summary["eval"]  # on the folders' held-out documents, blended alike
    assert (run / "vocab.txt").read_bytes() == (tmp_path / "news" / "vocab.txt").read_bytes()
    code, _, err = cli(capsys, "pretrain", "--data", f"{tmp_path / 'news'}:0.7", str(tmp_path / "wiki"), "--out",
                       tmp_path / "run2", "--config", "tiny", "--quiet")
    assert code != 0 and "every folder a weight (FOLDER:WEIGHT) or none" in err and not (tmp_path / "run2").exists()
    code, _, err = cli(capsys, "pretrain", "--data", f"{tmp_path / 'news'}:0.7", f"{run}:0.3", "--out",
                       run / "inner", "--config", "tiny", "--quiet")
    assert code != 0 and "--data" in err  # an output inside an input is refused


def test_parse_data_reads_names_as_the_filesystem_has_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_data([":0.5"]) == [(Path(":0.5"), None)]  # nothing before the colon: all of it is the name
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep:abc").mkdir()  # a folder whose name has a colon, beside one named as its head
    assert parse_data(["prep:abc"]) == [(Path("prep:abc"), None)]
    for bad in ("prep:inf", "prep:-inf"):
        with pytest.raises(ValueError, match=f"--data {bad}: the weight after ':' must be a number > 0"):
            parse_data([bad])
    with pytest.raises(ValueError, match="--data prep/../prep: given twice"):
        parse_data(["prep:1", "prep/../prep:2"])


def test_one_folder_is_read_alone_and_a_blend_needs_two_opened_alike(prepared, tmp_path):
    one = open_data([(prepared / "data", None)], seed=3)
    assert type(one) is PretrainingData and one.seed == 3
    with pytest.raises(ValueError, match="a blend needs at least two folders"):
        BlendedData([(one, None)])
    with pytest.raises(ValueError, match=r"opened alike \(seed, rank, world_size, shuffle, masked\)"):
        BlendedData([(one, 1.0), (PretrainingData(prepared / "eval", seed=4), 1.0)])
    empty = tmp_path / "empty"
    shutil.copytree(prepared / "eval", empty)
    manifest = json.loads((empty / "manifest.json").read_text(encoding="utf-8"))
    (empty / "manifest.json").write_text(json.dumps({**manifest, "shards": []}), encoding="utf-8")
    with pytest.raises(ValueError, match=f"--data {empty}: holds no instances"):
        open_data([(prepared / "data", 1.0), (empty, 1.0)])


def test_draws_are_the_largest_remainders():
    from torchbert.data.blend import _draws

    # exact 1.4, 2.1, 3.5: the one left over goes to the largest remainder, not to the first folder
    assert _draws(np.array([0.2, 0.3, 0.5]), 7).tolist() == [1, 2, 4]
    assert _draws(np.array([1.0, 1.0, 1.0]), 10).tolist() == [4, 3, 3]  # ties: in folder order


def test_the_blend_describes_itself_not_its_first_folder(prepared):
    data = blend(prepared, (0.7, 0.3), seed=2)
    assert not {"counts", "shards", "heldout"} & set(data.manifest)  # those are each folder's own
    assert [b["folder"] for b in data.manifest["blend"]] == [str(prepared / "data"), str(prepared / "eval")]
    assert [b["weight"] for b in data.manifest["blend"]] == pytest.approx([0.7, 0.3])
    assert sum(b["per_epoch"] for b in data.manifest["blend"]) == len(data)


def test_each_epoch_deals_the_folders_anew_and_in_order_they_are_spread_evenly(prepared):
    data = blend(prepared, (0.5, 0.5), seed=4)
    which = [[data.locate(k)[0] for k in data.order(e)] for e in (0, 1)]
    assert which[0] != which[1]  # not only other instances: other slots
    held = blend(prepared, (0.75, 0.25), seed=4, shuffle=False)
    which = np.array([i for i, _ in map(held.locate, held.order(0))])
    for part in np.array_split(which, 8):  # every part of the epoch holds the folders at their weights
        assert abs((part == 1).mean() - 0.25) < 0.03
    assert [local for i, local in map(held.locate, held.order(0)) if i == 1][:5] == [0, 1, 2, 3, 4]  # its own order


def test_a_blend_locates_the_first_instance_of_each_folder_and_shares_its_tokens_by_weight(prepared):
    data = blend(prepared, (0.9, 0.1), seed=1)
    assert data.locate(data.starts[1]) == (1, 0) and data.locate(data.starts[1] - 1) == (0, len(data.parts[0]) - 1)
    got = [a.tolist() for a in data.token_arrays(1000)]  # 900 tokens of the first folder, 100 of the second
    assert got == [a.tolist() for a in data.parts[0].token_arrays(900)] + \
        [a.tolist() for a in data.parts[1].token_arrays(100)]
