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

Each pass is a few dense matrix products (``resampling_blocks``: blocks of
outputs over the input span they read, PIL's taps in each column) on the frame
as channel planes, reading only the pixels the center crop's outputs need,
which BLAS runs in a few milliseconds: on a 2-core EPYC, 640x360 -> 224 in
about 4 ms and 1920x1080 in about 19 ms, where gathering every output's taps
took 18-24 and 80-120 ms (interleaved, the same outputs).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sdqes_edge.errors import UserError

# The orders a frame's three channels may come in: OpenCV's (a video, a camera read here) and most others' (PIL,
# a ROS 2 image of encoding rgb8, a headset's SDK). CLIP takes RGB; a frame in the other order is not an error
# anyone could see, only scores that mistake a red ball for a blue one, so the order is said, never guessed.
CHANNEL_ORDERS = ("bgr", "rgb")

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


# Outputs per dense block of the resampling. Every output reads `taps` consecutive inputs, and a block is one
# dense BLAS product over the span its outputs read: about (1 + block / 4) times the banded arithmetic. Small
# blocks also keep a 640-wide frame's products under OpenBLAS's threading threshold, and threads for products
# this small lose more than they gain while the decoder and the model keep the cores busy: decoding and
# preprocessing a 640x360 video on a 2-core EPYC took 8.3 ms a frame with blocks of 8, 13.4 ms with 16.
RESAMPLE_BLOCK = 8


@functools.lru_cache(maxsize=64)
def resampling_blocks(in_size: int, out_size: int, first: int, count: int) -> tuple:
    """Outputs ``first .. first + count - 1`` of resizing ``in_size`` to ``out_size`` as dense blocks
    ``(output offset, input start, input stop, weights [stop - start, outputs])``, PIL's taps in each column."""
    starts, weights = resize_coefficients(in_size, out_size)
    starts, weights = starts[first : first + count], weights[first : first + count]
    taps = weights.shape[1]
    blocks = []
    for offset in range(0, count, RESAMPLE_BLOCK):
        block = slice(offset, offset + RESAMPLE_BLOCK)
        block_starts, block_weights = starts[block], weights[block]
        low, high = int(block_starts.min()), int(block_starts.max()) + taps
        dense = np.zeros((high - low, len(block_starts)))
        for column, (start, w) in enumerate(zip(block_starts, block_weights)):
            dense[start - low : start - low + taps, column] = w
        dense.flags.writeable = False  # shared by every frame of this size (cached)
        blocks.append((offset, low, high, dense))
    return tuple(blocks)


def input_span(blocks: tuple) -> tuple[int, int]:
    """The inputs (start, stop) that the blocks' outputs read."""
    return blocks[0][1], max(high for _, _, high, _ in blocks)


def _resample_columns(planes: np.ndarray, blocks: tuple, count: int, origin: int = 0) -> np.ndarray:
    """[C, H, W] -> [C, H, count]: each block one product over the input columns its outputs read (column 0 of
    ``planes`` being input ``origin``)."""
    rows = planes.reshape(-1, planes.shape[-1])  # [C*H, W], a view
    out = np.empty((rows.shape[0], count))
    for offset, low, high, dense in blocks:
        out[:, offset : offset + dense.shape[1]] = rows[:, low - origin : high - origin] @ dense
    return out.reshape(planes.shape[:-1] + (count,))


def _resample_rows(planes: np.ndarray, blocks: tuple, count: int, origin: int = 0) -> np.ndarray:
    """[C, H, W] -> [C, count, W]: each block one product over the input rows its outputs read, every channel
    (row 0 of ``planes`` being input ``origin``)."""
    out = np.empty((planes.shape[0], count, planes.shape[2]))
    for offset, low, high, dense in blocks:
        out[:, offset : offset + dense.shape[1]] = dense.T @ planes[:, low - origin : high - origin]
    return out


def _to_uint8(dtype: np.dtype) -> str:
    """How to bring an image of ``dtype`` to 8 bits: by its range (a 16-bit one divided as if it were in [0, 1]
    would saturate white)."""
    if np.issubdtype(dtype, np.integer) and np.iinfo(dtype).max > 255:
        return (f"for a {np.iinfo(dtype).bits}-bit image, pass "
                f"(image // {(np.iinfo(dtype).max + 1) // 256}).astype(numpy.uint8)")
    return "for an image in [0, 1], pass (image * 255).round().astype(numpy.uint8)"


def _conversion(image: np.ndarray) -> str:
    """How to make a grey, BGRA, channels-first or batched image the BGR frame the model takes (empty for other
    shapes)."""
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        return "; for a grey image, pass cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)"
    if image.ndim == 3 and image.shape[2] == 4:
        return "; for a BGRA image, drop its alpha: image[:, :, :3]"
    if image.ndim == 3 and image.shape[0] in (3, 4):  # a tensor's layout, [C, H, W], as numpy() gives it
        return "; for a channels-first image [3, H, W], pass image.transpose(1, 2, 0)"
    if image.ndim == 4 and image.shape[0] == 1:
        return "; for a batch of one image [1, H, W, 3], pass image[0] (each stream's frame is a Frame of its own)"
    return ""


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

    def __call__(self, frame: np.ndarray, channels: str = "bgr") -> np.ndarray:
        """One uint8 frame [H, W, 3], its channels in the order ``channels`` names (OpenCV's BGR unless said)
        -> normalized float32 [3, R, R], RGB."""
        if channels not in CHANNEL_ORDERS:
            raise UserError(f"channels names the order of a frame's colours, one of {', '.join(CHANNEL_ORDERS)}, "
                            f"not {channels!r}")
        if not isinstance(frame, np.ndarray):  # a PIL image or a list would fail deep in numpy
            raise UserError(f"expected a {channels.upper()} frame as a numpy array [H, W, 3], got a "
                            f"{type(frame).__name__}; "
                            "for an RGB PIL image, pass numpy.asarray(image) with channels='rgb'")
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise UserError(f"expected a colour frame [H, W, 3], got shape {frame.shape}{_conversion(frame)}")
        if frame.size == 0:  # the resize would divide by its zero side
            raise UserError(f"got an empty frame of shape {frame.shape}; give an image at least 1x1 pixel")
        if frame.dtype != np.uint8:  # a float image in [0, 1] would pass as a black one
            raise UserError(f"expected a uint8 {channels.upper()} frame as OpenCV reads it, got {frame.dtype}; "
                            f"{_to_uint8(frame.dtype)}")
        size = self.image_size
        h, w = frame.shape[:2]
        if self.resize_shorter_side:
            # torchvision: the shorter side becomes `size`, the longer one int(size * long / short).
            new_h, new_w = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
        else:
            new_h, new_w = size, size
        top, left = 0, 0
        out_h, out_w = new_h, new_w
        if self.center_crop:  # only the output pixels the crop keeps are computed
            top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
            out_h, out_w = size, size
        if (new_h, new_w) != (h, w):
            columns, rows = resampling_blocks(w, new_w, left, out_w), resampling_blocks(h, new_h, top, out_h)
            (x0, x1), (y0, y1) = input_span(columns), input_span(rows)
            # Only the pixels the kept outputs read, as float planes [3, y1 - y0, x1 - x0] (a center crop of
            # a 16:9 frame reads 60% of its columns). Horizontal first, then vertical, each clipped to the 8-bit
            # range as PIL does (bicubic overshoots).
            planes = np.ascontiguousarray(frame[y0:y1, x0:x1].transpose(2, 0, 1), dtype=np.float64)
            planes = _resample_columns(planes, columns, out_w, origin=x0)
            np.clip(planes, 0.0, 255.0, out=planes)
            planes = _resample_rows(planes, rows, out_h, origin=y0)
            np.clip(planes, 0.0, 255.0, out=planes)
        else:
            planes = frame[top : top + out_h, left : left + out_w].transpose(2, 0, 1).astype(np.float64)
        rgb = (planes[::-1] if channels == "bgr" else planes) / 255.0
        rgb = (rgb - np.asarray(self.mean, np.float64)[:, None, None]) / np.asarray(self.std, np.float64)[:, None, None]
        return np.ascontiguousarray(rgb, dtype=np.float32)

    def batch(self, frames: Sequence[np.ndarray], channels: str = "bgr") -> np.ndarray:
        """Several frames -> [N, 3, R, R]."""
        return np.stack([self(f, channels) for f in frames])
