"""The run folders' plots (eval/plots.py): what each figure holds, read from the figure itself as it is
closed (curves, their labels and points, reference lines, titles and axes), and a PNG written in
place of nothing else. The commands that draw them are tested for the files alone."""

import json

import matplotlib.pyplot as plt
import pytest

from torchbert.eval import plots


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot closes, kept to be read."""
    kept = []
    close = plt.close

    def keep(fig=None):
        kept.append(fig)
        close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return kept


def curves(ax) -> dict:
    """label -> (x, y, linestyle, marker) of each plotted line that has a label of its own."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()), line.get_linestyle(),
                               line.get_marker())
            for line in ax.get_lines() if not line.get_label().startswith("_")}


def legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_line_plot_draws_each_series_and_the_reference_lines(tmp_path, figures):
    path = tmp_path / "loss.png"
    plots.line_plot(path, "pretraining loss: run", "step", "loss",
                    {"loss": ([1, 2], [5.0, 4.0], "-"), "held-out loss": ([2], [4.5], "o--")},
                    {"count table: unigram": 0.05, "count table: left": 0.06})
    (fig,) = figures
    ax = fig.axes[0]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("pretraining loss: run", "step", "loss")
    got = curves(ax)
    assert got["loss"] == ([1, 2], [5.0, 4.0], "-", "None") and got["held-out loss"] == ([2], [4.5], "--", "o")
    assert got["count table: unigram"][1] == [0.05, 0.05] and got["count table: unigram"][2] == ":"
    assert ax.get_lines()[2].get_color() == "gray" and ax.get_lines()[3].get_color() == "tab:brown"
    assert legend(ax) == ["loss", "held-out loss", "count table: unigram", "count table: left"]
    assert is_png(path) and [p.name for p in tmp_path.iterdir()] == ["loss.png"]  # written whole, nothing else


def test_a_plot_that_fails_as_it_is_written_leaves_nothing(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def breaks(self, target, **kw):
        with open(target, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Figure, "savefig", breaks)
    (tmp_path / "loss.png").write_bytes(b"the last run's plot")
    with pytest.raises(OSError, match="Input/output error"):
        plots.line_plot(tmp_path / "loss.png", "t", "x", "y", {"a": ([1], [1], "-")})
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]  # no half PNG, no temporary file
    assert (tmp_path / "loss.png").read_bytes() == b"the last run's plot"


def test_errorbar_panels_side_by_side_with_a_baseline_and_plain_ticks(tmp_path, figures):
    path = tmp_path / "gain.png"
    plots.errorbar_panels(path, [
        {"title": "sentiment", "xlabel": "pretraining steps", "series": {"BERT": ([0, 2000, 16000], [0.6, 0.7, 0.8],
                                                                                  [0.01, 0.02, 0.03])},
         "baseline": (0.6, "random weights"), "log_x": True},
        {"title": "ner", "xlabel": "steps", "series": {"BERT": (list(range(9)), [0.1] * 9, [0.0] * 9)}}])
    (fig,) = figures
    left, right = fig.axes
    assert [a.get_title() for a in fig.axes] == ["sentiment", "ner"] and left.get_xlabel() == "pretraining steps"
    (bars,) = left.containers  # an error bar container per series: its line, and a standard deviation either side
    assert bars.get_label() == "BERT" and list(bars[0].get_xdata()) == [0, 2000, 16000]
    assert list(bars[0].get_ydata()) == [0.6, 0.7, 0.8]
    assert curves(left)["random weights"][1:3] == ([0.6, 0.6], "--")
    assert [round(float(s[1][1] - s[0][1]), 6) for s in bars[2][0].get_segments()] == [0.02, 0.04, 0.06]
    assert left.get_xscale() == "log" and right.get_xscale() == "linear" and "random weights" not in curves(right)
    assert [t.get_text() for t in left.get_xticklabels()] == ["0", "2,000", "16,000"]  # the points, written plainly
    assert legend(left) == ["random weights", "BERT"] and right.get_legend() is None
    assert is_png(path)


def test_pretraining_plots_hold_every_objective_and_the_held_out_points(tmp_path, figures):
    rows = [{"step": 10, "tokens": 1000, "seconds": 1.0, "loss": 9.0, "mlm_loss": 8.0, "nsp_loss": 1.0,
             "mlm_accuracy": 0.01, "nsp_accuracy": 0.5, "eval_loss": 9.5},  # a held-out loss alone
            {"step": 20, "tokens": 2000, "seconds": 2.0, "loss": 8.0, "mlm_loss": 7.2, "nsp_loss": 0.8,
             "mlm_accuracy": 0.05, "nsp_accuracy": 0.6, "eval_loss": 8.5, "eval_mlm_loss": 7.6, "eval_nsp_loss": 0.9,
             "eval_mlm_accuracy": 0.04, "eval_nsp_accuracy": 0.55},
            {"step": 30, "tokens": 3000, "seconds": 3.5, "loss": 7.0, "mlm_loss": 6.4, "nsp_loss": 0.6,
             "mlm_accuracy": 0.09, "nsp_accuracy": 0.7, "eval_mlm_loss": 6.9, "eval_mlm_accuracy": 0.08,
             "eval_nsp_accuracy": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    plots.plot_pretraining(tmp_path, {"unigram": 0.046, "left": 0.053, "neighbours": 0.112, "masked": 99})
    loss, accuracy, learning = figures
    got = curves(loss.axes[0])
    assert list(got) == ["loss", "held-out loss", "mlm_loss", "held-out mlm_loss", "nsp_loss", "held-out nsp_loss"]
    assert got["loss"][:2] == ([10, 20, 30], [9.0, 8.0, 7.0]) and got["held-out mlm_loss"][:2] == ([20, 30], [7.6, 6.9])
    assert got["held-out loss"][:2] == ([10, 20], [9.5, 8.5])
    assert loss.axes[0].get_title() == f"pretraining loss: {tmp_path.name}"
    got = curves(accuracy.axes[0])
    assert list(got) == ["mlm_accuracy", "held-out mlm_accuracy", "nsp_accuracy", "held-out nsp_accuracy",
                         "count table: unigram", "count table: left", "count table: neighbours"]
    assert got["count table: neighbours"][1] == [0.112, 0.112]
    assert not any(k.startswith("count table") for k in curves(loss.axes[0]))  # yardsticks are accuracies
    tokens, seconds = learning.axes
    assert learning._suptitle.get_text() == f"held-out accuracy: {tmp_path.name}"
    assert (tokens.get_xlabel(), seconds.get_xlabel()) == ("training tokens", "training seconds")
    assert curves(tokens)["mlm_accuracy"][:2] == ([2000, 3000], [0.04, 0.08])  # where accuracies were measured
    assert curves(seconds)["nsp_accuracy"][:2] == ([2.0, 3.5], [0.55, 0.6])
    assert curves(seconds)["count table: left"][1:3] == ([0.053, 0.053], "--")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["accuracy.png", "learning.png", "loss.png"]


def test_pretraining_with_nothing_logged_or_no_held_out_set(tmp_path, figures):
    (tmp_path / "metrics.jsonl").write_text("")
    plots.plot_pretraining(tmp_path)
    assert figures == [] and not list(tmp_path.glob("*.png"))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens": 8, "seconds": 0.1, "loss": 2.0,
                                                        "mlm_loss": 2.0, "mlm_accuracy": 0.1}) + "\n")
    plots.plot_pretraining(tmp_path)
    assert len(figures) == 2 and not (tmp_path / "learning.png").exists()  # no held-out figures: no learning plot
    assert "count table: unigram" not in curves(figures[1].axes[0])


def test_fine_tuning_plots_the_loss_and_each_dev_score_by_epoch(tmp_path, figures):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 0.7}) + "\n" +
                                            json.dumps({"step": 10, "loss": 0.5}) + "\n")
    history = [{"epoch": 1, "step": 10, "accuracy": 0.8, "f1": 0.7, "mse": 0.1, "examples_total": 40},
               {"epoch": 2, "step": 20, "accuracy": 0.85, "f1": 0.75, "mse": 0.09, "examples_total": 40}]
    (tmp_path / "best.json").write_text(json.dumps({"history": history}))
    plots.plot_finetuning(tmp_path, "accuracy")
    loss, dev = figures
    assert curves(loss.axes[0])["training loss"][:2] == ([5, 10], [0.7, 0.5])
    assert dev.axes[0].get_title() == f"dev scores: {tmp_path.name} (best by accuracy)"
    assert curves(dev.axes[0]) == {"accuracy": ([1, 2], [0.8, 0.85], "-", "o"), "f1": ([1, 2], [0.7, 0.75], "-", "o")}


def test_fine_tuning_with_no_history_or_no_steps_logged(tmp_path, figures):
    (tmp_path / "metrics.jsonl").write_text("")
    plots.plot_finetuning(tmp_path, "accuracy")  # no best.json: no dev plot, and no loss rows: no loss plot
    assert figures == [] and not list(tmp_path.glob("*.png"))
