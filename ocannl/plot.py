"""Terminal plots and a progress bar for examples, drawn by plotext and tqdm (the ``plot`` extra).

The core package needs nothing beyond numpy, and ``import ocannl`` never imports this module;
examples such as the half-moons demo use it to show a loss curve, a decision boundary and training
progress in the terminal (over ssh and in CI logs alike). Drawing is left to two maintained
libraries instead of code of our own; this module only adapts the framework's data to them and,
when they are missing, says which extra to install: ``pip install 'ocannl[plot]'``.

plotext 6 replaced the module-level API used here (``clf``, ``plotsize``, ``build``), hence the
``plotext<6`` bound of the extra.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

import numpy as np

from ocannl.errors import OcannlError

POSITIVE_POINT, NEGATIVE_POINT, POSITIVE_REGION = "x", "o", "·"


class PlotExtraMissing(OcannlError, ImportError):
    """A plotting helper was called without the optional libraries it draws with."""


def _require(module: str, helper: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PlotExtraMissing(
            f"ocannl.plot.{helper} draws with {module}, which is optional; install the plot extra "
            f"with: pip install 'ocannl[plot]' (or: pip install plotext tqdm)") from e


def _figure(width: int, height: int, title: str | None):
    """A cleared plotext figure of ``width x height`` characters, without colours or styles."""
    plt = _require("plotext", "figure")
    plt.clf()
    plt.theme("clear")
    plt.plotsize(width, height)
    if title:
        plt.title(title)
    return plt


def _render(plt, color: bool | None) -> str:
    """The figure as text; ANSI colour codes only when asked (default: when stdout is a terminal)."""
    text = plt.build()
    if color is None:
        color = sys.stdout.isatty()
    return text if color else plt.uncolorize(text)


def loss_curve(losses: Sequence[float], *, title: str = "loss", xlabel: str = "step",
               width: int = 72, height: int = 18, log_y: bool = True,
               color: bool | None = None) -> str:
    """The losses as a line plot over 1..n, on a log scale by default (losses span decades).

    Non-finite values, and values <= 0 on the log scale, are left out rather than drawn at an
    arbitrary height; the x axis still spans every step and its label counts those left out. A
    series with nothing left to draw is an error.
    """
    y = np.asarray(losses, dtype=np.float64).reshape(-1)
    steps = np.arange(1, y.size + 1)
    keep = np.isfinite(y) & ((y > 0) if log_y else True)
    if not keep.any():
        raise ValueError(f"loss_curve: none of the {y.size} losses can be drawn "
                         f"(non-finite{', or <= 0 on the log scale' if log_y else ''})")
    plt = _figure(width, height, title)
    plt.plot(steps[keep].tolist(), y[keep].tolist(), marker="braille")
    plt.xlim(1, max(y.size, 2))
    if log_y:
        plt.yscale("log")
    dropped = int(y.size - keep.sum())
    if dropped:
        why = "non-finite or <= 0 on the log scale" if log_y else "non-finite"
        xlabel = f"{xlabel} ({dropped} of {y.size} not drawn: {why})"
    plt.xlabel(xlabel)
    return _render(plt, color)


def _points_and_labels(points, labels) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(points, dtype=np.float64)
    lab = np.asarray(labels, dtype=np.float64).reshape(-1)
    if p.ndim != 2 or p.shape[1] != 2:
        raise ValueError(f"decision_boundary: points must have shape (n, 2), got {p.shape}")
    if lab.shape[0] != p.shape[0]:
        raise ValueError(f"decision_boundary: {p.shape[0]} points but {lab.shape[0]} labels")
    return p, lab


def decision_boundary(predict: Callable[[np.ndarray], np.ndarray], points, labels, *,
                      width: int = 72, height: int = 24, title: str = "decision boundary",
                      color: bool | None = None) -> str:
    """The classifier's positive region over the data's bounding box, with the data on top.

    ``predict`` maps an ``(m, 2)`` array of points to ``m`` scores; it is called once, on a
    ``width x height`` grid, at least one point per cell of the canvas (which the axes and title
    make smaller than the figure), and a score > 0 marks the cell ``·``. Data points with a
    label > 0 draw as ``x``, the others as ``o``; the edge of the dotted region is the boundary.
    """
    p, lab = _points_and_labels(points, labels)
    (x0, y0), (x1, y1) = p.min(axis=0), p.max(axis=0)
    pad_x, pad_y = 0.05 * (x1 - x0 or 1.0), 0.05 * (y1 - y0 or 1.0)
    x0, x1, y0, y1 = x0 - pad_x, x1 + pad_x, y0 - pad_y, y1 + pad_y
    gx, gy = np.meshgrid(np.linspace(x0, x1, width), np.linspace(y0, y1, height))
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
    scores = np.asarray(predict(grid), dtype=np.float64).reshape(-1)
    if scores.size != grid.shape[0]:
        raise ValueError(f"decision_boundary: predict returned {scores.size} scores "
                         f"for {grid.shape[0]} grid points")
    plt = _figure(width, height, title)
    region = grid[scores > 0]
    plt.scatter(region[:, 0].tolist(), region[:, 1].tolist(), marker=POSITIVE_REGION)
    for mask, mark, name in ((lab > 0, POSITIVE_POINT, "label > 0"),
                             (lab <= 0, NEGATIVE_POINT, "label <= 0")):
        plt.scatter(p[mask, 0].tolist(), p[mask, 1].tolist(), marker=mark, label=name)
    plt.xlim(x0, x1)
    plt.ylim(y0, y1)
    return _render(plt, color)


def progress(total: int, *, label: str | None = None, **options):
    """A tqdm progress bar over ``total`` steps; by default silent when stderr is not a terminal.

    Use it as tqdm's: ``bar.update(n)``, ``bar.set_postfix(loss=...)``, ``bar.close()`` (or a
    ``with`` block). ``options`` go to :class:`tqdm.tqdm` as they are.
    """
    tqdm = _require("tqdm", "progress")
    options.setdefault("disable", None)  # tqdm's "off unless the output is a terminal"
    return tqdm.tqdm(total=total, desc=label, **options)
