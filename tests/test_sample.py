"""The built-in sample made in parallel (for the GPU bench's long video): the sample's scene, its noise drawn per
block of frames, so the frames are the same whatever the number of processes."""

from __future__ import annotations

import numpy as np

from sdqes_edge.sample import PARALLEL_CHUNK_FRAMES, SENSOR_NOISE, sample_frames, sample_frames_in_parallel


def test_frames_made_in_parallel_are_the_same_in_any_number_of_processes_and_show_the_samples_scene():
    count = 2 * PARALLEL_CHUNK_FRAMES + 7  # three blocks, the last a short one
    one = sample_frames_in_parallel(count, 48, 64, seed=2, workers=1)
    two = sample_frames_in_parallel(count, 48, 64, seed=2, workers=2)  # two processes
    assert one.shape == (count, 48, 64, 3) and one.dtype == np.uint8
    np.testing.assert_array_equal(two, one)
    # The scene is the sample's; only the noise differs (two independent draws: by sqrt(2) sigma).
    sequential = sample_frames(count, 48, 64, seed=2).astype(np.float32)
    difference = one.astype(np.float32) - sequential
    assert abs(difference.mean()) < 0.1 and abs(difference.std() - np.sqrt(2) * SENSOR_NOISE) < 0.5


def test_the_samples_streams_are_its_frames_preprocessed_and_staggered_without_holding_every_raw_frame():
    """An export's 2,000 drift frames held raw were 460 MB beside the preprocessed ones; made and preprocessed a
    chunk at a time, the same values."""
    import tracemalloc

    from sdqes_edge.config import preset
    from sdqes_edge.runtime.preprocess import Preprocessor
    from sdqes_edge.sample import STREAM_OFFSET_FRAMES, image_bytes, sample_streams

    pre = Preprocessor.from_config(preset("tiny"))
    for count, batch in [(70, 1), (66, 3)]:
        streams = sample_streams(pre, count, batch, pre.image_size)
        preprocessed = pre.batch(sample_frames(count + STREAM_OFFSET_FRAMES * (batch - 1)))
        assert streams.shape == (count, batch, 3, pre.image_size, pre.image_size)
        for b in range(batch):
            np.testing.assert_array_equal(streams[:, b], preprocessed[STREAM_OFFSET_FRAMES * b:][:count])
    tracemalloc.start()
    try:
        sample_streams(pre, 400, 1, pre.image_size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < image_bytes(400, 240, 320) / 2, f"{peak / 2**20:.0f} MiB at the peak"
