"""Per-query plots for ``sdqes-edge eval``: score curve, threshold, event start, tolerance window, alerts."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .annotations import Annotation
from .errors import UserError, install_command, module_absent
from .files import make_folders, replaced_atomically
from .metrics import RECALL_KS, TOLERANCE_WINDOWS, ScoreTrace, predictions

PLOTS_NEED = f"matplotlib is not installed ({install_command('matplotlib')})"


def plotting_available() -> bool:
    """Checked before long work starts, so a missing optional extra skips the plots instead of failing at the end."""
    return not module_absent("matplotlib")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError(f"plots need matplotlib: `{install_command('matplotlib')}` (or pass --plots 0)") from None
    matplotlib.use("Agg")  # files only; no display on a server or a robot
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, **options) -> Path:
    """``fig`` written to ``path`` whole (``replaced_atomically``), then closed. matplotlib writes into a handle: a
    refusal (a full disk) named no file, and the cut-off image was left as the plot."""
    try:
        with replaced_atomically(path) as partial:
            fig.savefig(partial, format=Path(path).suffix.lstrip("."), **options)
    finally:
        _pyplot().close(fig)
    return path


def plot_query(path: Path, trace: ScoreTrace, annotation: Annotation, threshold: float, title: str) -> Path:
    plt = _pyplot()
    times = np.arange(trace.length) / trace.fps
    before, after = TOLERANCE_WINDOWS[0]
    preds = predictions(trace, threshold)[: max(RECALL_KS)]
    fig, ax = plt.subplots(figsize=(11, 3.2), dpi=100)
    ax.axvspan(annotation.start_time - before, annotation.start_time + after, color="tab:green", alpha=0.15,
               label=f"tolerance [-{before:g}, +{after:g}] s")
    shown = trace.probs if trace.scored is None else np.where(trace.scored, trace.probs, np.nan)  # unscored: a gap
    ax.plot(times, shown, color="tab:blue", lw=1.2, label="p = sigmoid(cos)")
    ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"threshold {threshold:.3f}")
    ax.axvline(annotation.start_time, color="tab:green", lw=2, label="event start")
    if trace.asked_time > 0:
        ax.axvline(trace.asked_time, color="gray", ls=":", lw=1.5, label="query asked")
    if len(preds):
        ax.scatter(preds / trace.fps, trace.probs[preds], marker="v", s=70, color="tab:red", zorder=5,
                   label=f"first {len(preds)} alert(s)")
    ax.set_xlabel("stream time (s)")
    ax.set_ylabel("probability")
    ax.set_xlim(0, max(times[-1] if len(times) else 1, annotation.start_time + after))
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)  # outside, never over the curve
    fig.tight_layout()
    return save_figure(fig, path)


def plot_extremes(out_dir: Path, traces: list[ScoreTrace], annotations: list[Annotation], thresholds: list[float],
                  distances: list[int], count: int) -> list[Path]:
    """The ``count`` best (closest first alert) and worst queries, one PNG each."""
    if count <= 0 or not traces:
        return []
    make_folders(out_dir)
    order = np.argsort(distances, kind="stable")
    picks = [("best", i) for i in order[:count]] + [("worst", i) for i in order[::-1][:count]]
    written = []
    for rank, (kind, i) in enumerate(picks):
        a = annotations[i]
        slug = re.sub(r"[^a-z0-9]+", "-", a.query.lower())[:40].strip("-")
        title = f"{kind}: {a.query}  (video {a.video_uid[:8]}, first alert {distances[i]} frames from the start)"
        written.append(plot_query(out_dir / f"{kind}-{rank % count + 1:02d}-{slug}.png", traces[i], a, thresholds[i],
                                  title))
    return written
