"""ocannl.plot: the adapter from training data to plotext and tqdm, and its missing-extra error."""

import importlib.util
import io
import subprocess
import sys

import numpy as np
import pytest

from ocannl import data, plot
from ocannl.errors import OcannlError

# The drawing tests need the plot extra; the missing-extra and import tests do not.
needs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("plotext", "tqdm")),
    reason="the plot extra (plotext, tqdm) is not installed: pip install 'ocannl[plot]'")

ESC = "\x1b"


def _plot_rows(text: str) -> list[str]:
    """The rows inside the plot frame (between the top and bottom rules), frame columns removed."""
    rows = text.splitlines()
    top = next(i for i, r in enumerate(rows) if "┌" in r)
    bottom = next(i for i, r in enumerate(rows) if "└" in r)
    left = rows[top].index("┌")  # the left frame column: "│", or "┤" beside a tick label
    return [r[left + 1:].rstrip("│ ") for r in rows[top + 1:bottom]]


@needs_extra
def test_loss_curve_draws_a_falling_braille_line_with_title_and_step_axis():
    losses = np.exp(-np.linspace(0, 4, 200))
    text = plot.loss_curve(losses, title="hinge loss per step", width=60, height=14, color=False)
    assert ESC not in text
    lines = text.splitlines()
    assert "hinge loss per step" in lines[0]
    assert lines[-1].strip() == "step"
    rows = _plot_rows(text)
    marks = [[i for i, ch in enumerate(r) if 0x2800 < ord(ch) <= 0x28FF] for r in rows]
    assert marks[0] and marks[-1], "the curve reaches the top and the bottom rows"
    # Falling: the top row's marks lie left of the bottom row's.
    assert max(marks[0]) < min(marks[-1])
    # The x axis spans steps 1..200.
    assert "1.0" in lines[-2] and "200.0" in lines[-2]


@needs_extra
def test_loss_curve_colour_follows_the_argument():
    assert ESC in plot.loss_curve([1.0, 0.5, 0.25], color=True)
    assert ESC not in plot.loss_curve([1.0, 0.5, 0.25], color=False)


@needs_extra
def test_loss_curve_leaves_out_non_finite_and_non_positive_on_a_log_scale():
    text = plot.loss_curve([1.0, np.nan, 0.0, np.inf, 0.1, 0.0], color=False, log_y=True)
    axis = [r.split("┤")[0].strip() for r in text.splitlines() if "┤" in r]
    assert float(axis[0]) == pytest.approx(1.0) and float(axis[-1]) == pytest.approx(0.1)
    lines = text.splitlines()
    assert lines[-2].rstrip().endswith("6.0"), "the x axis spans every step, drawn or not"
    assert "(4 of 6 not drawn: non-finite or <= 0 on the log scale)" in lines[-1]
    with pytest.raises(ValueError, match="none of the 3 losses can be drawn"):
        plot.loss_curve([0.0, -1.0, np.nan])
    # On a linear scale zero and negative losses are drawn.
    linear = plot.loss_curve([1.0, 0.0, -1.0, np.nan], color=False, log_y=False)
    assert "-1.00" in linear and "(1 of 4 not drawn: non-finite)" in linear


@needs_extra
def test_decision_boundary_marks_the_positive_region_and_both_classes():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = np.array([0, 0, 1, 1])
    calls = []

    def predict(grid):
        calls.append(grid.shape)
        return grid[:, 1] - 0.5  # positive in the upper half

    text = plot.decision_boundary(predict, points, labels, width=40, height=16, color=False)
    assert calls == [(40 * 16, 2)], "predict is called once, on the whole grid"
    rows = _plot_rows(text)
    upper, lower = rows[2:len(rows) // 2 - 1], rows[len(rows) // 2 + 1:]
    assert upper and all(plot.POSITIVE_REGION in r for r in upper)
    assert lower and not any(plot.POSITIVE_REGION in r for r in lower)
    # The legend's two marks, then the labelled points: positives above, negatives below.
    legend = f"{plot.POSITIVE_POINT * 2} label > 0", f"{plot.NEGATIVE_POINT * 2} label <= 0"
    assert legend[0] in rows[0] and legend[1] in rows[1]
    assert "".join(rows[:len(rows) // 2]).replace(legend[0], "").count(plot.POSITIVE_POINT) >= 1
    assert "".join(lower).count(plot.NEGATIVE_POINT) == 2
    assert plot.NEGATIVE_POINT not in "".join(upper)


@needs_extra
def test_decision_boundary_on_moons_shows_both_classes_and_a_region():
    points, labels = data.moons(200, noise=0.1, seed=0)
    text = plot.decision_boundary(lambda g: g[:, 1] - 0.25, points, labels, color=False)
    body = "\n".join(_plot_rows(text))
    assert body.count(plot.POSITIVE_POINT) > 20 and body.count(plot.NEGATIVE_POINT) > 20
    assert body.count(plot.POSITIVE_REGION) > 100


def test_decision_boundary_rejects_bad_shapes():
    points, labels = data.moons(20)
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        plot.decision_boundary(lambda g: g[:, 0], points[:, :1], labels)
    with pytest.raises(ValueError, match="20 points but 19 labels"):
        plot.decision_boundary(lambda g: g[:, 0], points, labels[:-1])
    with pytest.raises(ValueError, match="returned 1 scores"):
        plot.decision_boundary(lambda g: np.zeros(1), points, labels)


@pytest.mark.parametrize("module, call", [
    ("plotext", lambda: plot.loss_curve([1.0, 0.5])),
    ("plotext", lambda: plot.decision_boundary(lambda g: g[:, 0], *data.moons(20))),
    ("tqdm", lambda: plot.progress(10)),
])
def test_a_missing_library_names_the_extra(monkeypatch, module, call):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(plot.PlotExtraMissing, match=rf"draws with {module}.*pip install 'ocannl\[plot\]'") as e:
        call()
    assert isinstance(e.value, ImportError) and isinstance(e.value, OcannlError)


def test_the_core_package_and_this_module_import_neither_library():
    code = ("import sys, ocannl, ocannl.plot; "
            "print(sorted(m for m in ('plotext', 'tqdm', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@needs_extra
def test_progress_is_silent_off_a_terminal_and_draws_when_enabled():
    quiet = io.StringIO()
    with plot.progress(5, label="training", file=quiet) as bar:
        bar.update(5)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    with plot.progress(4, label="training", file=shown, disable=False, mininterval=0) as bar:
        bar.set_postfix(epoch_loss="0.1250")
        bar.update(4)
    text = shown.getvalue()
    assert "training" in text and "4/4" in text and "100%" in text and "epoch_loss=0.1250" in text


@needs_extra
def test_moons_demo_prints_its_loss_curve_and_decision_boundary(capsys):
    from examples import moons

    moons.main(["--epochs", "2", "--backend", "interp"])
    out = capsys.readouterr().out
    assert "summed hinge loss per epoch" in out and "decision boundary" in out
    assert "plots drawn in" in out and "epoch   2:" in out
