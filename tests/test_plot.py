"""Terminal plots, the progress bar, and the optional PNG output."""

import io
import sys

import numpy as np
import pytest

from ocannl import data, plot


def test_loss_curve_small_ascii_plot_is_pinned():
    """Four values on a straight line from 3 down to 1: a shallow slope drawn with the ramp."""
    expected = [
        "3+'-___                     ",
        " |    ''-___                ",
        "2+         ''---___         ",
        " |                ''-___    ",
        "1+                     ''-__",
        " +--------------------------",
        "  0       1                3",
    ]
    out = plot.loss_curve([3, 7 / 3, 5 / 3, 1], width=28, height=5, style="ascii")
    assert out.split("\n") == expected


def test_loss_curve_layout_and_labels():
    values = np.exp(-np.arange(500) / 100.0)
    out = plot.loss_curve(values, width=72, height=16, title="hinge loss")
    lines = out.split("\n")
    assert len(lines) == 1 + 16 + 2  # title, plot rows, x axis, step labels
    assert "hinge loss" in lines[0]
    assert all(len(line) <= 72 for line in lines)
    assert lines[1].lstrip().startswith("1┤")  # max label on the top row
    assert lines[16].lstrip().startswith("0.006")  # min label on the bottom row
    assert lines[-1].split() == ["0", "249", "499"]
    # A falling curve: the top row is lit at the left end, the bottom row at the right end.
    plot_rows = [line.split("┤")[-1].split("│")[-1] for line in lines[1:17]]
    assert plot_rows[0][0] != "\u2800" and plot_rows[0][-1] == "\u2800"
    assert plot_rows[-1][-1] != "\u2800" and plot_rows[-1][0] == "\u2800"
    assert all(0x2800 <= ord(ch) <= 0x28FF for row in plot_rows for ch in row)


def test_loss_curve_every_column_is_connected():
    """With more steps than dot columns, no column of the curve is empty."""
    values = np.sin(np.arange(3000) / 50.0)
    out = plot.loss_curve(values, width=60, height=10)
    rows = [line.split("┤")[-1].split("│")[-1] for line in out.split("\n")[:10]]
    width = len(rows[0])
    assert all(len(row) == width for row in rows) and width > 40
    for c in range(width):
        assert any(row[c] != "\u2800" for row in rows), f"column {c} is empty"


def test_loss_curve_ascii_is_ascii_and_constant_series_works():
    out = plot.loss_curve([0.5] * 20, width=40, height=6, style="ascii")
    assert out.isascii()
    assert "0.5" in out


def test_loss_curve_skips_non_finite_and_log_zeros():
    out = plot.loss_curve([1.0, np.nan, 0.5, np.inf, 0.25], width=40, height=6)
    assert "0.25" in out
    out = plot.loss_curve([1.0, 0.1, 0.0, 0.01], width=40, height=6, log_y=True)
    assert "(log scale)" in out and "0.01" in out
    with pytest.raises(ValueError, match="no finite"):
        plot.loss_curve([np.nan, np.nan])
    with pytest.raises(ValueError, match="no room"):
        plot.loss_curve([1.0, 2.0], width=12)
    with pytest.raises(ValueError, match="style"):
        plot.loss_curve([1.0, 2.0], style="sixel")


def test_decision_boundary_background_and_points():
    calls = []

    def predict(grid):
        calls.append(grid)
        return grid[:, :1] - 0.5  # (m, 1) scores: positive right of x = 0.5

    points = np.array([[0.05, 0.05], [0.95, 0.95]], dtype=np.float32)
    labels = np.array([[1.0], [-1.0]], dtype=np.float32)
    out = plot.decision_boundary(
        predict, points, labels, width=10, height=4, xlim=(0, 1), ylim=(0, 1)
    )
    assert len(calls) == 1
    assert calls[0].dtype == np.float32 and calls[0].shape == (40, 2)
    lines = out.split("\n")
    assert lines[0] == "+----------+" and lines[5] == "+----------+"
    assert lines[1] == "|     ....o|"  # top row: the -1 point at (0.95, 0.95), upper right
    assert lines[2] == "|     .....|"
    assert lines[4] == "|+    .....|"  # bottom row: the +1 point at (0.05, 0.05)
    assert "'+' label > 0" in lines[6] and "x in [0, 1]" in lines[6]


def test_decision_boundary_majority_and_flat_scores_and_outside_points():
    points = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [5.0, 5.0]])
    labels = np.array([-1.0, -1.0, 1.0, 1.0])
    out = plot.decision_boundary(
        lambda g: np.zeros(len(g)), points, labels, width=3, height=3, xlim=(0, 1), ylim=(0, 1)
    )
    lines = out.split("\n")
    assert lines[2] == "| o |"
    assert "1 points outside" in lines[-1]


def test_decision_boundary_on_moons_shows_both_classes():
    points, labels = data.moons(n=200)
    out = plot.decision_boundary(lambda g: g[:, 1] - 0.25, points, labels)
    assert "+" in out[1:-1] and "o" in out and "." in out
    assert len(out.split("\n")) == 24 + 3


def test_decision_boundary_rejects_bad_shapes():
    points, labels = data.moons(n=20)
    with pytest.raises(ValueError, match=r"must return scores of shape"):
        plot.decision_boundary(lambda g: np.zeros((len(g), 2)), points, labels)
    with pytest.raises(ValueError, match="labels must have shape"):
        plot.decision_boundary(lambda g: g[:, 0], points, labels[:5])
    with pytest.raises(ValueError, match="low < high"):
        plot.decision_boundary(lambda g: g[:, 0], points, labels, xlim=(1, 0))


def test_save_png_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    for name in [
        "matplotlib",
        "matplotlib.figure",
        "matplotlib.backends",
        "matplotlib.backends.backend_agg",
    ]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'ocannl\[plot\]'"):
        plot.save_png(tmp_path / "loss.png", losses=[1.0, 0.5])


def test_save_png_checks_its_arguments_first(tmp_path):
    with pytest.raises(ValueError, match="nothing to draw"):
        plot.save_png(tmp_path / "x.png")
    with pytest.raises(ValueError, match="needs all of"):
        plot.save_png(tmp_path / "x.png", predict=lambda g: g[:, 0])


def test_save_png_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    points, labels = data.moons(n=100)
    path = plot.save_png(
        tmp_path / "moons.png",
        losses=np.linspace(1, 0, 50),
        predict=lambda g: g[:, 1] - 0.25,
        points=points,
        labels=labels,
        resolution=40,
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_is_silent_off_a_terminal():
    stream = io.StringIO()
    with plot.ProgressBar(10, label="train", stream=stream) as bar:
        for _ in range(10):
            bar.update(loss=0.5)
    assert stream.getvalue() == ""
    assert bar.count == 10


def test_progress_bar_draws_count_percent_rate_eta_and_postfix():
    clock, stream = FakeClock(), FakeTTY()
    bar = plot.ProgressBar(100, label="train", stream=stream, clock=clock)
    clock.now += 2.0
    bar.update(25, loss=np.float32(0.123456), lr=np.array([0.2], dtype=np.float32), epoch=3)
    text = stream.getvalue().split("\r")[-1]
    assert text.startswith("train [######------------------]  25/100  25%")
    assert "12.5 it/s" in text and "ETA 0:06" in text
    assert text.endswith("loss=0.1235 lr=0.2 epoch=3")
    clock.now += 6.0
    bar.update(75)
    bar.close()
    final = stream.getvalue().split("\r")[-1]
    assert "100/100 100%" in final and "in 0:08" in final and "ETA" not in final
    assert final.endswith("\n")
    bar.close()  # closing twice writes nothing more
    assert stream.getvalue().split("\r")[-1] == final


def test_progress_bar_redraws_at_most_every_min_interval():
    clock = FakeClock()
    stream = io.StringIO()
    with plot.ProgressBar(1000, stream=stream, force=True, clock=clock) as bar:
        for _ in range(500):
            bar.update()  # the same instant as the draw on entering: no redraw
        assert stream.getvalue().count("\r") == 1
        clock.now += 0.0625
        bar.update()
        assert stream.getvalue().count("\r") == 1
        clock.now += 0.0625
        bar.update()
        assert stream.getvalue().count("\r") == 2
        assert "502/1000" in stream.getvalue()
    assert stream.getvalue().count("\r") == 3  # and the final one on closing
    assert stream.getvalue().endswith("\n")


def test_progress_bar_ends_its_line_on_error_and_pads_shorter_lines():
    clock, stream = FakeClock(), FakeTTY()
    with pytest.raises(RuntimeError):
        with plot.ProgressBar(5, stream=stream, clock=clock) as bar:
            clock.now += 1
            bar.update(note="a long message here")
            clock.now += 1
            bar.update(note="x")
            raise RuntimeError("boom")
    frames = stream.getvalue().split("\r")[1:]  # entering, two updates, closing
    assert len(frames) == 4
    assert "note=x" in frames[2]
    assert len(frames[2]) == len(frames[1])  # the shorter line is padded over the longer one
    assert frames[3].endswith("\n")
    with pytest.raises(ValueError, match="positive int"):
        plot.ProgressBar(0)
