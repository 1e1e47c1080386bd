"""What the runtime tests share: a tiny exported QRNN bundle (sampled at 5 fps), a query, a video writer."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import random_model

from sdqes_edge.export import ExportOptions, export_bundle

QUERY = "When I start to clean or wipe the table, remind me to sanitize my hands."
FPS = 5.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny QRNN model and its bundle, sampled at 5 fps."""
    model = random_model("qrnn")
    out = tmp_path_factory.mktemp("rt") / "bundle"
    export_bundle(model, out, ExportOptions(fps=FPS, show_progress=False), log=lambda m: None)
    return model, out


def write_video(path: Path, frames: np.ndarray, fps: float = 10.0) -> Path:
    fourcc = cv2.VideoWriter_fourcc(*("MJPG" if path.suffix == ".avi" else "mp4v"))
    writer = cv2.VideoWriter(str(path), fourcc, fps, (frames.shape[2], frames.shape[1]))
    assert writer.isOpened(), f"OpenCV cannot write {path.suffix}"
    for frame in frames:
        writer.write(frame)
    writer.release()
    return path
