"""Terminal plots and a progress bar, with no dependency beyond numpy; PNG files via matplotlib.

The moons demo (shared/DESIGN.md §4) prints a progress bar, the loss curve and the decision
boundary; this module draws them as text, so the core package needs nothing but numpy and the
demo works over ssh, in CI logs and in a notebook's output alike. :func:`save_png` draws the same
figures with matplotlib when the ``plot`` extra is installed (``pip install 'ocannl[plot]'``).

Why not a terminal plotting library such as plotext: the two plots the project needs fit in a
couple hundred lines here, a dependency would have to stay optional anyway (the core depends only
on numpy, so the text renderer must exist regardless), and tests of our own renderer can pin its
output exactly.

Two character sets are offered for the loss curve. ``"braille"`` (the default) packs 2 x 4 dots
into each character cell (Unicode U+2800..U+28FF), for 8 times the resolution of one mark per
cell; ``"ascii"`` draws with ``' - _ |`` (3 heights per cell) for terminals or logs that cannot
show braille. The decision boundary is always ASCII: its cells hold data points, not dots.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

_BRAILLE_BLANK = 0x2800
# The dot bit of braille cell position (row, column), rows top to bottom (Unicode's numbering of
# the 8 dots: 1 2 3 7 down the left column, 4 5 6 8 down the right).
_BRAILLE_BITS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]])

# ASCII cells are 1 dot wide and 3 high, marked by their lowest lit dot (top, middle, bottom);
# a cell lit in all three rows is part of a steep stretch and draws "|".
_ASCII_MARKS = "'-_"

_FRAMES = {
    # style: (labelled tick, axis, corner, x-axis rule)
    "braille": ("┤", "│", "└", "─"),
    "ascii": ("+", "|", "+", "-"),
}


class _DotCanvas:
    """A grid of on/off dots, ``cell_w x cell_h`` dots per character cell."""

    def __init__(self, width_cells: int, height_cells: int, style: str):
        self.style = style
        self.cell_w, self.cell_h = (2, 4) if style == "braille" else (1, 3)
        self.width_cells, self.height_cells = width_cells, height_cells
        self.dots = np.zeros((height_cells * self.cell_h, width_cells * self.cell_w), dtype=bool)

    @property
    def dot_width(self) -> int:
        return self.dots.shape[1]

    @property
    def dot_height(self) -> int:
        return self.dots.shape[0]

    def vline(self, x: int, y0: int, y1: int) -> None:
        """Set the dots of column ``x`` from row ``y0`` to ``y1`` inclusive (in either order)."""
        lo, hi = min(y0, y1), max(y0, y1)
        self.dots[lo : hi + 1, x] = True

    def line(self, x0: int, y0: int, x1: int, y1: int) -> None:
        """A connected line from dot (x0, y0) to (x1, y1), ``x0 <= x1``.

        In each column it spans the rows the straight segment crosses there, so steep and flat
        stretches both stay joined."""
        if x0 == x1:
            self.vline(x0, y0, y1)
            return
        prev_y = y0
        for x in range(x0, x1 + 1):
            # The segment's height at the right edge of this column (x1 at the last column).
            t = min(1.0, (x - x0 + 0.5) / (x1 - x0))
            y = round(y0 + t * (y1 - y0)) if x < x1 else y1
            self.vline(x, prev_y, y)
            prev_y = y

    def render(self) -> list[str]:
        """One string per character row."""
        h, w = self.height_cells, self.width_cells
        if self.style == "braille":
            cells = self.dots.reshape(h, 4, w, 2)
            codes = np.einsum("rayb,ab->ry", cells.astype(np.int64), _BRAILLE_BITS)
            return ["".join(chr(_BRAILLE_BLANK + int(c)) for c in row) for row in codes]
        cells = self.dots.reshape(h, 3, w)
        rows = []
        for r in range(h):
            chars = []
            for c in range(w):
                lit = np.flatnonzero(cells[r, :, c])
                if lit.size == 0:
                    chars.append(" ")
                elif lit.size == 3:
                    chars.append("|")
                else:
                    chars.append(_ASCII_MARKS[lit[-1]])
            rows.append("".join(chars))
        return rows


def _fmt_number(v: float) -> str:
    return f"{v:.4g}"


def _place_labels(width: int, labels: Sequence[tuple[int, str]]) -> str:
    """A line ``width`` wide with each text starting at (or, near the right end, ending at) its
    column; a label that would overlap an earlier one is left out."""
    line = [" "] * width
    taken_until = -1
    for col, text in labels:
        start = min(max(col, 0), max(width - len(text), 0))
        if start <= taken_until:
            continue
        for k, ch in enumerate(text[: width - start]):
            line[start + k] = ch
        taken_until = start + len(text)
    return "".join(line).rstrip()


def loss_curve(
    values,
    width: int = 72,
    height: int = 16,
    title: str | None = None,
    *,
    log_y: bool = False,
    style: str = "braille",
) -> str:
    """A text plot of a sequence of losses (or any series) against its step numbers.

    ``width`` is the whole plot's width in characters, y-axis labels included; ``height`` is the
    number of rows of the plotting area. The y axis is labelled with the maximum (top row), the
    minimum (bottom row) and, from 5 rows on, the value of the middle row; the x axis with the
    first, middle and last step (0-based). With more steps than dot columns, each column shows
    the range the curve covers there, so noise stays visible as a band; with fewer, consecutive
    steps are joined by lines.
    Non-finite values (and, with ``log_y``, values <= 0, e.g. a hinge loss reaching 0) are left
    out and break the line. ``style`` is ``"braille"`` or ``"ascii"``. Returns the plot as a
    string of lines without a trailing newline.
    """
    if style not in _FRAMES:
        raise ValueError(f"loss_curve: style must be 'braille' or 'ascii', got {style!r}")
    y = np.asarray(values, dtype=np.float64).ravel()
    n = y.size
    shown = np.isfinite(y) & ((y > 0) if log_y else True)
    if not shown.any():
        what = "finite positive" if log_y else "finite"
        raise ValueError(f"loss_curve: no {what} values to plot among {n}")
    plotted = np.log10(y, where=shown, out=np.zeros_like(y)) if log_y else y
    lo, hi = float(plotted[shown].min()), float(plotted[shown].max())

    def label(v: float) -> str:
        return _fmt_number(10.0**v if log_y else v)

    y_labels = {0: label(hi), height - 1: label(lo)}
    if height >= 5:
        y_labels[(height - 1) // 2] = label(hi - (hi - lo) * ((height - 1) // 2) / (height - 1))
    label_w = max(len(s) for s in y_labels.values())
    plot_w = width - label_w - 1
    if plot_w < 8 or height < 2:
        raise ValueError(
            f"loss_curve: {width}x{height} leaves no room to plot beside the {label_w}-character "
            f"labels; use width >= {label_w + 9} and height >= 2"
        )

    canvas = _DotCanvas(plot_w, height, style)
    dw, dh = canvas.dot_width, canvas.dot_height
    span = hi - lo
    xs = np.round(np.arange(n) * ((dw - 1) / max(n - 1, 1))).astype(int)
    if span > 0:
        ys = np.round((hi - plotted) / span * (dh - 1))
    else:
        ys = np.full(n, (dh - 1) // 2)
    ys = np.where(shown, ys, 0).astype(int)
    for i in range(n):
        if not shown[i]:
            continue
        if i > 0 and shown[i - 1]:
            canvas.line(xs[i - 1], ys[i - 1], xs[i], ys[i])
        else:
            canvas.vline(xs[i], ys[i], ys[i])

    tick, axis, corner, rule = _FRAMES[style]
    lines = []
    heading = " ".join(filter(None, [title, "(log scale)" if log_y else None]))
    if heading:
        lines.append(" " * (label_w + 1) + heading.center(plot_w).rstrip())
    for r, row in enumerate(canvas.render()):
        if r in y_labels:
            lines.append(f"{y_labels[r]:>{label_w}}{tick}{row}")
        else:
            lines.append(f"{'':>{label_w}}{axis}{row}")
    lines.append(" " * label_w + corner + rule * plot_w)
    # Step labels sit under the dot columns of steps 0, (n-1)//2 and n-1.
    steps = sorted({0, (n - 1) // 2, n - 1})
    x_labels = []
    for step in steps:
        text = str(step)
        cell = int(xs[step]) // canvas.cell_w
        x_labels.append((cell - len(text) // 2 if 0 < step < n - 1 else cell, text))
    lines.append(" " * (label_w + 1) + _place_labels(plot_w, x_labels))
    return "\n".join(lines)


POSITIVE_POINT = "+"
NEGATIVE_POINT = "o"
POSITIVE_REGION = "."
NEGATIVE_REGION = " "


def _limits(values: np.ndarray, given) -> tuple[float, float]:
    """``given`` as floats, or the data's range padded by 10% on each side."""
    if given is not None:
        a, b = float(given[0]), float(given[1])
        if not a < b:
            raise ValueError(
                f"decision_boundary: a limit must be (low, high) with low < high, got {given!r}"
            )
        return a, b
    a, b = float(values.min()), float(values.max())
    pad = 0.1 * (b - a) if b > a else 0.5
    return a - pad, b + pad


def _grid_scores(predict: Callable, grid: np.ndarray) -> np.ndarray:
    """``predict(grid)`` as a flat float array, or a ValueError saying what shape was expected."""
    m = grid.shape[0]
    scores = np.asarray(predict(grid))
    if scores.shape not in ((m,), (m, 1)):
        raise ValueError(
            f"decision_boundary: predict was given {m} points of shape ({m}, 2) and must return "
            f"scores of shape ({m},) or ({m}, 1), got {scores.shape}"
        )
    return scores.reshape(m).astype(np.float64)


def _points_and_labels(points, labels, who: str) -> tuple[np.ndarray, np.ndarray]:
    points = np.asarray(points, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"{who}: points must have shape (n, 2), got {points.shape}")
    if labels.shape not in ((points.shape[0],), (points.shape[0], 1)):
        n = points.shape[0]
        raise ValueError(
            f"{who}: labels must have shape ({n},) or ({n}, 1) to match the points, "
            f"got {labels.shape}"
        )
    return points, labels.reshape(-1)


def decision_boundary(
    predict: Callable[[np.ndarray], np.ndarray],
    points,
    labels,
    width: int = 64,
    height: int = 24,
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
) -> str:
    """A text map of a 2-D classifier: the sign of its score in the background, the data on top.

    The plane ``xlim x ylim`` (by default the data's range plus 10% on each side) is cut into
    ``width x height`` cells; ``predict`` is called once, with the float32 ``(width * height, 2)``
    array of cell centres, and returns ``(m,)`` or ``(m, 1)`` scores. A cell whose score is > 0
    shows ``"."``, otherwise ``" "``; a cell holding data points shows ``"+"`` for label > 0 and
    ``"o"`` otherwise (when a cell holds both, the class with more points there, ``"+"`` on a
    tie). The map is framed, and followed by a legend with the limits. Rows run from the top
    (``ylim[1]``) down, as on paper. Returns the lines without a trailing newline.
    """
    points, labels = _points_and_labels(points, labels, "decision_boundary")
    if width < 1 or height < 1:
        raise ValueError(f"decision_boundary: width and height must be >= 1, got {width}x{height}")
    x0, x1 = _limits(points[:, 0], xlim)
    y0, y1 = _limits(points[:, 1], ylim)
    dx, dy = (x1 - x0) / width, (y1 - y0) / height
    centres_x = x0 + (np.arange(width) + 0.5) * dx
    centres_y = y1 - (np.arange(height) + 0.5) * dy
    grid_x, grid_y = np.meshgrid(centres_x, centres_y)
    grid = np.stack([grid_x.ravel(), grid_y.ravel()], axis=1).astype(np.float32)
    scores = _grid_scores(predict, grid).reshape(height, width)
    cells = np.where(scores > 0, POSITIVE_REGION, NEGATIVE_REGION).astype("<U1")

    col = np.floor((points[:, 0] - x0) / dx).astype(np.int64)
    row = np.floor((y1 - points[:, 1]) / dy).astype(np.int64)
    inside = (col >= 0) & (col < width) & (row >= 0) & (row < height)
    positive = labels > 0
    votes = np.zeros((height, width), dtype=np.int64)  # (+1 points) - (other points) per cell
    present = np.zeros((height, width), dtype=bool)
    np.add.at(votes, (row[inside], col[inside]), np.where(positive[inside], 1, -1))
    present[row[inside], col[inside]] = True
    cells[present & (votes >= 0)] = POSITIVE_POINT
    cells[present & (votes < 0)] = NEGATIVE_POINT

    lines = ["+" + "-" * width + "+"]
    lines += ["|" + "".join(r) + "|" for r in cells]
    lines.append("+" + "-" * width + "+")
    outside = int((~inside).sum())
    lines.append(
        f"{POSITIVE_POINT!r} label > 0, {NEGATIVE_POINT!r} label <= 0, "
        f"{POSITIVE_REGION!r} score > 0; "
        f"x in [{_fmt_number(x0)}, {_fmt_number(x1)}], y in [{_fmt_number(y0)}, {_fmt_number(y1)}]"
        + (f"; {outside} points outside" if outside else "")
    )
    return "\n".join(lines)


def _require_matplotlib():
    """matplotlib's object-oriented pieces, or an ImportError that says how to install them.

    The Figure/Agg canvas API is used instead of pyplot so that saving a PNG never changes the
    user's global matplotlib backend or opens a window.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "ocannl.plot.save_png needs matplotlib, which is optional; install it with "
            "pip install 'ocannl[plot]' (or print the text plots: loss_curve, decision_boundary)"
        ) from e
    return Figure, FigureCanvasAgg


def save_png(
    path: str | os.PathLike,
    *,
    losses=None,
    predict: Callable[[np.ndarray], np.ndarray] | None = None,
    points=None,
    labels=None,
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
    title: str | None = None,
    log_y: bool = False,
    resolution: int = 200,
    dpi: int = 100,
) -> Path:
    """Write the loss curve and/or the decision boundary to a PNG file with matplotlib.

    Give ``losses`` for the loss curve, ``predict``, ``points`` and ``labels`` (as for
    :func:`decision_boundary`) for the decision boundary, or both for the two side by side. The
    boundary evaluates ``predict`` once on a ``resolution x resolution`` float32 grid. Raises an
    ``ImportError`` naming ``pip install 'ocannl[plot]'`` when matplotlib is missing. Returns the
    path written.
    """
    want_boundary = predict is not None or points is not None or labels is not None
    if losses is None and not want_boundary:
        raise ValueError(
            "save_png: nothing to draw; pass losses=..., or predict=, points= and labels="
        )
    if want_boundary and (predict is None or points is None or labels is None):
        raise ValueError(
            "save_png: the decision boundary needs all of predict=, points= and labels="
        )
    if want_boundary:
        points, labels = _points_and_labels(points, labels, "save_png")
    Figure, FigureCanvasAgg = _require_matplotlib()

    panels = int(losses is not None) + int(want_boundary)
    fig = Figure(figsize=(5.5 * panels, 4.5), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, k + 1) for k in range(panels)]
    if title:
        fig.suptitle(title)

    if losses is not None:
        ax = axes.pop(0)
        y = np.asarray(losses, dtype=np.float64).ravel()
        ax.plot(np.arange(y.size), y, linewidth=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        if log_y:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)

    if want_boundary:
        ax = axes.pop(0)
        x0, x1 = _limits(points[:, 0], xlim)
        y0, y1 = _limits(points[:, 1], ylim)
        gx, gy = np.meshgrid(np.linspace(x0, x1, resolution), np.linspace(y0, y1, resolution))
        grid = np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)
        scores = _grid_scores(predict, grid).reshape(resolution, resolution)
        ax.contourf(
            gx,
            gy,
            (scores > 0).astype(float),
            levels=[-0.5, 0.5, 1.5],
            colors=["#f3d6d6", "#d6e2f3"],
        )
        if scores.min() < 0 < scores.max():
            ax.contour(gx, gy, scores, levels=[0.0], colors="k", linewidths=0.8)
        positive = labels > 0
        ax.scatter(points[positive, 0], points[positive, 1], s=8, c="#1f5fb4", label="label > 0")
        ax.scatter(points[~positive, 0], points[~positive, 1], s=8, c="#b41f1f", label="label <= 0")
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.legend(loc="upper right", fontsize="small")

    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    return path


def _fmt_duration(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt_postfix(postfix: dict) -> str:
    """``k=v`` pairs; floats, numpy ones and one-element float arrays (what ``t.numpy()`` gives
    for a scalar loss) to 4 significant digits."""

    def fmt(v) -> str:
        if isinstance(v, (float, np.floating)) or (
            isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind == "f"
        ):
            return _fmt_number(float(v.reshape(()) if isinstance(v, np.ndarray) else v))
        return str(v)

    return " ".join(f"{k}={fmt(v)}" for k, v in postfix.items())


class ProgressBar:
    """A one-line progress bar redrawn in place: count/total, percent, rate, ETA, and your values.

    ``with ProgressBar(6400, label="train") as bar: ... bar.update(loss=l)`` draws::

        train [#########---------------] 2400/6400  38% 1523.4 it/s ETA 0:03 loss=0.1234

    ``update(n=1, **postfix)`` advances by ``n`` and remembers the keyword values (shown after
    the ETA, floats to 4 significant digits). The line is redrawn at most once per
    ``min_interval`` seconds (0.1 by default: ~10 times a second, cheap next to a training step)
    and when the count reaches ``total``; closing (leaving the ``with`` block, even on an error)
    draws the final state, with the elapsed time in place of the ETA, and ends the line.

    Output goes to ``stream`` (``sys.stderr`` at construction when ``None``, so redirecting
    stderr later still works). When ``stream`` is not a terminal the bar is silent unless
    ``force=True``: carriage-return redraws would litter log files and CI output, and a log
    reader wants the final loss, which the caller prints anyway. ``clock`` (seconds, monotonic)
    is there for tests.
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        stream: TextIO | None = None,
        *,
        force: bool = False,
        width: int = 24,
        min_interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not isinstance(total, (int, np.integer)) or total <= 0:
            raise ValueError(f"ProgressBar: total must be a positive int, got {total!r}")
        self.total = int(total)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = force or bool(isatty and isatty())
        self.width = width
        self.min_interval = min_interval
        self.clock = clock
        self.count = 0
        self.postfix: dict = {}
        self._start = clock()
        self._last_draw: float | None = None
        self._last_len = 0
        self._closed = False

    def __enter__(self) -> ProgressBar:
        self._draw()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False

    def update(self, n: int = 1, **postfix) -> None:
        """Advance by ``n`` steps; keyword values replace those of the same name on the line."""
        self.count += n
        self.postfix.update(postfix)
        if not self.enabled:
            return
        now = self.clock()
        if (
            self._last_draw is None
            or now - self._last_draw >= self.min_interval
            or self.count >= self.total
        ):
            self._draw(now)

    def close(self) -> None:
        """Draw the final state and end the line (once; later calls do nothing)."""
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            self._draw(final=True)
            self.stream.write("\n")
            self.stream.flush()

    def render(self, now: float | None = None, final: bool = False) -> str:
        """The bar's text at time ``now`` (without the carriage return), drawn or not."""
        now = self.clock() if now is None else now
        elapsed = max(now - self._start, 0.0)
        frac = min(self.count / self.total, 1.0)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        digits = len(str(self.total))
        parts = [
            f"{self.label} " if self.label else "",
            f"[{bar}] {self.count:>{digits}}/{self.total} {frac:4.0%}",
        ]
        rate = self.count / elapsed if elapsed > 0 else 0.0
        if rate >= 1:
            parts.append(f" {rate:.1f} it/s")
        elif rate > 0:
            parts.append(f" {1 / rate:.2f} s/it")
        if final:
            parts.append(f" in {_fmt_duration(elapsed)}")
        elif rate > 0 and self.count < self.total:
            parts.append(f" ETA {_fmt_duration((self.total - self.count) / rate)}")
        if self.postfix:
            parts.append(" " + _fmt_postfix(self.postfix))
        return "".join(parts)

    def _draw(self, now: float | None = None, final: bool = False) -> None:
        if not self.enabled:
            return
        now = self.clock() if now is None else now
        text = self.render(now, final)
        # Pad with spaces over what a longer previous line left behind.
        self.stream.write("\r" + text + " " * max(self._last_len - len(text), 0))
        self.stream.flush()
        self._last_len = len(text)
        self._last_draw = now
