"""Reading frames from a video file with OpenCV (what calibration and tests need).

The streaming sources (camera, URL, image folder, sampling by timestamp) build
on the same OpenCV capture.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from ..errors import UserError


def read_frames(path: str | Path, count: int) -> list[np.ndarray]:
    """Up to ``count`` BGR frames spread evenly over the video at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"video {path} does not exist; give the path of a video file OpenCV can read")
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise UserError(f"OpenCV cannot open {path} as a video; convert it to mp4 (H.264) or avi (MJPG)")
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        frames: list[np.ndarray] = []
        if total > 0:
            wanted = set(np.linspace(0, total - 1, num=min(count, total)).round().astype(int).tolist())
            index = 0
            while len(frames) < len(wanted):
                ok, frame = capture.read()
                if not ok:
                    break
                if index in wanted:
                    frames.append(frame)
                index += 1
        else:  # some containers do not report a frame count: take the first `count`
            while len(frames) < count:
                ok, frame = capture.read()
                if not ok:
                    break
                frames.append(frame)
    finally:
        capture.release()
    if not frames:
        raise UserError(f"{path} holds no frame OpenCV can decode; check the file plays, or re-encode it")
    return frames
