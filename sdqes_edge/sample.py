"""The built-in sample: a small synthetic clip and a few real queries, with no download.

Used where the SDK needs realistic input without the user's data: export
verification frames, int8 calibration when no video is given, and `check`.
The clip is procedural (numpy only) and deterministic: a drifting background,
a disk that moves across the scene, and a square that appears half way through
(an "event starts"), so temporal adapters see frames that change over time.

The example queries and alert messages are EgoSDQES annotations (MIT licence,
../shared/data/egosdqes_all.csv), copied here because the runtime must not
need the dataset.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

import numpy as np

EXAMPLE_QUERIES: tuple[tuple[str, str], ...] = (
    ("When I start to clean or wipe the table, remind me to sanitize my hands.",
     "Remember to sanitize your hands."),
    ("As I start to drink my beverage, remind me to check the shopping list.",
     "Remember to check the shopping list."),
    ("When I start moving or arranging small tools, please remind me to wear gloves for safety.",
     "Remember to wear gloves before handling tools."),
    ("Next time I place a tissue roll in a shelf, remind me to check if I have enough tissue paper.",
     "Remember to check if you have enough tissue paper."),
)

SAMPLE_HEIGHT = 240
SAMPLE_WIDTH = 320
SENSOR_NOISE = 6.0  # standard deviation of the per-pixel noise, in grey levels
PARALLEL_CHUNK_FRAMES = 100  # frames per process task in sample_frames_in_parallel


def _scene_frame(t: int, count: int, xx: np.ndarray, yy: np.ndarray, base_colour: np.ndarray) -> np.ndarray:
    """Frame ``t`` of ``count`` without its sensor noise, float32 [H, W, 3] (BGR)."""
    height, width = xx.shape
    phase = 2 * np.pi * t / max(count, 8)
    # Each wave, and each term of the disk's distance, varies along one axis: computed on a row [1, W] or a
    # column [H, 1] and broadcast, the same values as over the whole grid in half the time.
    x, y = xx[:1], yy[:, :1]
    frame = np.empty((height, width, 3), dtype=np.float32)
    for c in range(3):
        frame[..., c] = (base_colour[c] + 40 * np.sin(x / width * 3 + phase + c)) + 30 * np.cos(y / height * 2 - phase)
    # A disk crossing the scene.
    cx = (0.1 + 0.8 * ((t * 0.07) % 1.0)) * width
    cy = height * (0.5 + 0.25 * np.sin(phase))
    disk = (x - cx) ** 2 + (y - cy) ** 2 < (0.12 * min(height, width)) ** 2
    frame[disk] = (30, 160, 230)
    # The "event": a square appears in the second half of the clip.
    if t >= count // 2:
        side = int(0.25 * min(height, width))
        top, left = height // 5, width // 2
        frame[top : top + side, left : left + side] = (200, 60, 40)
    return frame


def _with_noise(frame: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    frame += rng.normal(0, SENSOR_NOISE, size=frame.shape).astype(np.float32)
    return np.clip(frame, 0, 255).astype(np.uint8)


def _scene_grid(height: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.random.Generator, np.ndarray]:
    """(x, y pixel grids, the sample's generator, its background colour: the generator's first draw)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    return xx, yy, rng, rng.uniform(40, 200, size=3).astype(np.float32)


def iter_sample_frames(count: int, height: int = SAMPLE_HEIGHT, width: int = SAMPLE_WIDTH, seed: int = 0):
    """The ``count`` frames of the sample one at a time, [H, W, 3] uint8 in BGR order (what OpenCV delivers):
    a long sample streams in constant memory."""
    xx, yy, rng, base_colour = _scene_grid(height, width, seed)
    for t in range(count):
        yield _with_noise(_scene_frame(t, count, xx, yy, base_colour), rng)


def _sample_chunk(count: int, first: int, stop: int, height: int, width: int, seed: int) -> np.ndarray:
    """Frames ``first .. stop - 1`` of a clip of ``count`` for ``sample_frames_in_parallel``: the sample's scene,
    with noise from a generator of their own."""
    xx, yy, _, base_colour = _scene_grid(height, width, seed)
    rng = np.random.default_rng([seed, first])
    return np.stack([_with_noise(_scene_frame(t, count, xx, yy, base_colour), rng) for t in range(first, stop)])


def sample_frames_in_parallel(count: int, height: int = SAMPLE_HEIGHT, width: int = SAMPLE_WIDTH, seed: int = 0,
                              workers: int | None = None) -> np.ndarray:
    """``count`` frames of the sample's scene, [count, H, W, 3] uint8 BGR, made by ``workers`` processes (default:
    every core), for a long clip only its timing needs (the GPU bench's 2,000-frame video took 45 s of one core,
    most of it drawing the noise). Each block of ``PARALLEL_CHUNK_FRAMES`` frames draws its noise from a generator
    of its own, so the frames are not ``sample_frames``' (which tests and golden vectors read), but the same scene
    with noise of the same statistics."""
    import contextlib
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    check_fits_in_memory(image_bytes(count, height, width), f"{count} sample frames of {width}x{height}")
    starts = range(0, count, PARALLEL_CHUNK_FRAMES)
    chunks = [(count, a, min(a + PARALLEL_CHUNK_FRAMES, count), height, width, seed) for a in starts]
    workers = min(workers or os.cpu_count() or 1, len(chunks))
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    # "spawn": a child of a process holding a CUDA context (the GPU bench) must not inherit it by fork.
    pool = (ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) if workers > 1
            else contextlib.nullcontext())
    with pool:
        made = (pool.map if workers > 1 else map)(_sample_chunk, *zip(*chunks))
        for first, block in zip(starts, made):
            frames[first : first + len(block)] = block  # one block at a time beside the frames, not a second copy
    return frames


def sample_frames(count: int, height: int = SAMPLE_HEIGHT, width: int = SAMPLE_WIDTH, seed: int = 0) -> np.ndarray:
    """``count`` frames [count, H, W, 3] uint8 in BGR order, all in memory (checked to fit first)."""
    check_fits_in_memory(image_bytes(count, height, width), f"{count} sample frames of {width}x{height}")
    frames = np.empty((count, height, width, 3), dtype=np.uint8)
    for t, frame in enumerate(iter_sample_frames(count, height, width, seed)):
        frames[t] = frame
    return frames


# Arrays meant to be held whole may take at most this share of the memory the kernel reports available: numpy's
# allocation succeeds lazily under Linux's overcommit, and filling it then gets the process killed (SIGKILL,
# no message) minutes later, where refusing at once can say what to ask for instead.
MAX_SHARE_OF_FREE_MEMORY = 0.8


def available_memory() -> int | None:
    """Bytes the kernel reports available (``MemAvailable``), or None where it does not say (not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def image_bytes(frames: int, height: int, width: int) -> int:
    """Bytes of ``frames`` BGR uint8 images [frames, H, W, 3], as OpenCV and the sample deliver them."""
    return frames * height * width * 3


def preprocessed_bytes(frames: int, image_size: int) -> int:
    """Bytes of ``frames`` preprocessed frames, [frames, 3, R, R] float32 (the image tower's input)."""
    return frames * 3 * image_size**2 * 4


# Activations [tokens, width] float32 that an image tower's window form holds per frame of its window while it runs,
# besides its attention maps: the growth of the peak memory with the window (tiny: 256 -> 1024 frames,
# clip-vit-b16: 8 -> 40 frames) was about 18 of them a frame for PyTorch's window form at both, and 67 (tiny) and
# 59 (clip-vit-b16) for ONNX Runtime running the window graph (41-52 for the export tracing it). Lower bounds, so
# what is refused for memory would certainly not have fitted.
TORCH_WINDOW_ACTIVATIONS = 16
ORT_WINDOW_ACTIVATIONS = 56


def window_bytes(vision, frames: int, activations_per_frame: int) -> int:
    """Bytes an image tower's window form (``vision``: a VisionConfig) holds at least over ``frames`` frames at once
    (every stream's window together), at ``activations_per_frame`` (TORCH_ or ORT_WINDOW_ACTIVATIONS)."""
    tokens = vision.num_tokens
    return frames * 4 * (activations_per_frame * tokens * vision.width + vision.heads * tokens**2)


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse (as a MemoryError, which the command line reports in one line) an array that would not fit."""
    free = available_memory()
    if free is not None and nbytes > MAX_SHARE_OF_FREE_MEMORY * free:
        raise MemoryError(f"{what} need {nbytes / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB is free")


STREAM_OFFSET_FRAMES = 3  # stream b of a batch starts this many frames after stream b-1, so the streams differ


def staggered_streams(frames: np.ndarray, count: int, batch: int) -> np.ndarray:
    """Preprocessed frames [count + STREAM_OFFSET_FRAMES * (batch - 1), ...] -> ``batch`` streams of ``count``
    frames, [count, batch, ...], each starting STREAM_OFFSET_FRAMES after the one before (one stream: a view,
    no copy; 2,000 ViT-B/16 frames are 1.2 GB)."""
    if batch == 1:
        return frames[:count, None]
    return np.stack([frames[STREAM_OFFSET_FRAMES * b : STREAM_OFFSET_FRAMES * b + count] for b in range(batch)],
                    axis=1)


def stream_frame_count(count: int, batch: int) -> int:
    """Frames to read for ``batch`` staggered streams of ``count`` frames."""
    return count + STREAM_OFFSET_FRAMES * (batch - 1)


def preprocessed_streams(read: Callable[[int], Iterable[np.ndarray]], preprocess, count: int, batch: int,
                         image_size: int, source: str | None = None, progress: str | None = None) -> np.ndarray:
    """``batch`` staggered streams of ``count`` frames, [count, batch, 3, R, R] (``staggered_streams``), from the
    BGR frames ``read(n)`` yields (at most n; fewer are cycled through), each through ``preprocess`` ([H, W, 3] ->
    [3, R, R] float32) into one array as it comes: neither every raw frame nor a list of preprocessed ones beside
    its stacked copy is held (2,000 ViT-B/16 frames are 1.2 GB). ``read`` is called after the memory check;
    ``source`` names where the frames come from in its message; ``progress``: a progress bar's title."""
    from .progress import progress_bar

    needed = stream_frame_count(count, batch)
    check_fits_in_memory(preprocessed_bytes(needed + (count * batch if batch > 1 else 0), image_size),
                         f"{batch} stream(s) of {count} frames{f' of {source}' if source else ''} at {image_size} px")
    prepared = np.empty((needed, 3, image_size, image_size), dtype=np.float32)
    frames = read(needed)
    bar = progress_bar(needed, "frame", progress or "", enabled=progress is not None, iterable=frames)
    got = 0
    for image in bar if bar is not None else frames:
        prepared[got] = preprocess(image)
        got += 1
    if got == 0:
        raise ValueError("no frames to make streams of")  # callers name their source's problem first
    for i in range(got, needed):  # a short source is cycled through
        prepared[i] = prepared[i % got]
    return staggered_streams(prepared, count, batch)


def sample_streams(preprocess, count: int, batch: int, image_size: int, progress: str | None = None) -> np.ndarray:
    """The built-in sample as ``batch`` staggered streams of ``count`` frames (``preprocessed_streams``)."""
    return preprocessed_streams(iter_sample_frames, preprocess, count, batch, image_size, progress=progress)
