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
