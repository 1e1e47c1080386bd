"""Camera frame -> the image tower's input, in numpy (no torch).

Reproduces CLIP's transform (``Resize(R, bicubic)`` of the shorter side,
``CenterCrop(R)``, ``ToTensor``, ``Normalize(mean, std)``) from the
preprocessing description a bundle carries. The resize is PIL's antialiased
bicubic filter (the one CLIP trains with), computed here in float64 without
PIL's intermediate rounding to 8 bits, instead of OpenCV's resize: OpenCV's
8-bit bicubic differs between its own releases by a grey level, and the native
runtime (native/src/stream.cpp) computes this very arithmetic, so the two
runtimes agree to 1e-6 whatever OpenCV a device has. Against PIL's transform
the difference is a fraction of a grey level (tests/test_runtime.py prints it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sdqes_edge.errors import UserError

BICUBIC_A = -0.5  # PIL's bicubic kernel parameter
BICUBIC_SUPPORT = 2.0


def _bicubic(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    a = BICUBIC_A
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@functools.lru_cache(maxsize=32)
def resize_coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """PIL's resampling taps as (start [out], weights [out, K]): output ``o`` is
    ``sum_k input[start[o] + k] * weights[o, k]``, the weights of each output summing to 1.

    When shrinking, the kernel is stretched by the scale (antialiasing), as PIL does. Every output
    uses K consecutive inputs (zero weights pad the shorter runs at the image edges), which lets
    the resampling read them as a sliding window.
    """
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = BICUBIC_SUPPORT * filter_scale
    taps = min(int(math.ceil(support)) * 2 + 1, in_size)
    starts = np.zeros(out_size, dtype=np.int64)
    weights = np.zeros((out_size, taps), dtype=np.float64)
    for out in range(out_size):
        center = (out + 0.5) * scale
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), in_size)
        w = _bicubic((np.arange(last - first) + first - center + 0.5) / filter_scale)
        start = min(first, in_size - taps)
        starts[out] = start
        weights[out, first - start : first - start + len(w)] = w / w.sum()
    return starts, weights


def _resample(image: np.ndarray, axis: int, starts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[H, W, 3] float64 -> the same with ``axis`` resampled to len(starts) outputs."""
    windows = sliding_window_view(image, weights.shape[1], axis=axis)  # a view: [..., K] appended
    if axis == 1:
        picked = windows[:, starts]  # [H, out, 3, K]
        return (picked @ weights[:, :, None])[..., 0]
    picked = windows[starts]  # [out, W, 3, K]
    return (picked @ weights[:, None, :, None])[..., 0]


@dataclass(frozen=True)
class Preprocessor:
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize_shorter_side: bool = True
    center_crop: bool = True

    @classmethod
    def from_description(cls, image_size: int, preprocess: dict) -> "Preprocessor":
        """From a manifest's (or a ModelConfig's) ``preprocess`` entry."""
        return cls(image_size=int(image_size), mean=tuple(preprocess["mean"]), std=tuple(preprocess["std"]),
                   resize_shorter_side=bool(preprocess.get("resize_shorter_side", True)),
                   center_crop=bool(preprocess.get("center_crop", True)))

    @classmethod
    def from_config(cls, cfg) -> "Preprocessor":
        """From a ``ModelConfig`` (what the exporter and the benchmarks hold)."""
        return cls.from_description(cfg.vision.image_size, cfg.to_dict()["preprocess"])

    def __call__(self, frame_bgr: np.ndarray) -> np.ndarray:
        """One BGR uint8 frame [H, W, 3] -> normalized float32 [3, R, R]."""
        if frame_bgr is None or frame_bgr.ndim != 3 or frame_bgr.shape[2] != 3:
            shape = None if frame_bgr is None else frame_bgr.shape
            raise UserError(f"expected a colour frame [H, W, 3], got shape {shape}")
        size = self.image_size
        h, w = frame_bgr.shape[:2]
        if self.resize_shorter_side:
            # torchvision: the shorter side becomes `size`, the longer one int(size * long / short).
            new_h, new_w = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
        else:
            new_h, new_w = size, size
        rows, cols = np.arange(new_h), np.arange(new_w)
        if self.center_crop:  # only the output pixels the crop keeps are computed
            top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
            rows, cols = rows[top : top + size], cols[left : left + size]
        image = frame_bgr.astype(np.float64)
        if (new_h, new_w) != (h, w):
            x_start, x_w = resize_coefficients(w, new_w)
            y_start, y_w = resize_coefficients(h, new_h)
            # Horizontal first, then vertical, each clipped to the 8-bit range as PIL does (bicubic overshoots).
            image = np.clip(_resample(image, 1, x_start[cols], x_w[cols]), 0.0, 255.0)
            image = np.clip(_resample(image, 0, y_start[rows], y_w[rows]), 0.0, 255.0)
        else:
            image = image[rows][:, cols]
        rgb = image[..., ::-1] / 255.0
        rgb = (rgb - np.asarray(self.mean, np.float64)) / np.asarray(self.std, np.float64)
        return np.ascontiguousarray(rgb.transpose(2, 0, 1), dtype=np.float32)

    def batch(self, frames_bgr: Sequence[np.ndarray]) -> np.ndarray:
        """Several frames -> [N, 3, R, R]."""
        return np.stack([self(f) for f in frames_bgr])
