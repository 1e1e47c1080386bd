"""A file is sampled at the bundle's fps by timestamp: sample time k / fps is served by the first frame at or after
it and steps at stream time k / fps, a frame repeated where the video is slower than the bundle (runtime/sampling.py;
the native runtime is held to the same counts by tests/vectors/sampling.json)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from runtime_fixtures import FPS, QUERY, write_video

from sdqes_edge.errors import UserError
from sdqes_edge.runtime import open_source
from sdqes_edge.runtime.sampling import END_SLACK_S, samples_served, stated_end_time
from sdqes_edge.runtime.sources import FrameSource, VideoFileSource
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores

LEVEL_STEP = 12


def grey_levels(count: int) -> np.ndarray:
    """Frames whose grey level tells them apart after compression: frame k is 12 * k (up to 21 frames)."""
    return np.stack([np.full((48, 64, 3), LEVEL_STEP * k, np.uint8) for k in range(count)])


def frame_number(image: np.ndarray) -> int:
    return round(float(np.median(image)) / LEVEL_STEP)


def test_a_frame_serves_every_sample_time_it_is_the_first_frame_at_or_after():
    period = 0.25
    assert samples_served(0.0, 0, period) == 1
    assert samples_served(0.1, 1, period) == 0  # between samples: skipped
    assert samples_served(0.5, 1, period) == 2  # serves 0.25 and 0.5
    assert samples_served(0.9999995, 4, period) == 1  # milliseconds a hair below 1.0 s still serve it


def test_a_broken_timestamp_far_past_the_stated_end_is_not_repeated_up_to_itself():
    end = stated_end_time(frame_count=10, native_fps=2.0)
    assert end == 5.0 + END_SLACK_S
    assert samples_served(1e9, 3, 1.0, end) == 4  # sample times 3, 4, 5, 6: not a billion
    assert stated_end_time(0, 30.0) is None and stated_end_time(100, 0.0) is None  # the container does not say


def test_a_video_slower_than_the_bundle_keeps_its_timeline_by_repeating_frames(tmp_path):
    """Each frame was taken once: a 2-fps video sampled at 4 fps ran twice as fast (10 s as 5 s), its alert times
    halved and the model shown events at twice their speed."""
    video = write_video(tmp_path / "slow.avi", grey_levels(20), fps=2.0)
    source = open_source(video, 4.0)
    notes = []
    source.log = notes.append
    frames = list(source.sampled())
    assert [f.time for f in frames] == [k * 0.25 for k in range(39)]  # 0 .. 9.5 s, as the video lasts
    # Sample k is served by the first frame at or after k / 4 s: frame ceil(k / 2), whose stamp is 0.5 s apart.
    assert [frame_number(f.image) for f in frames] == [-(-k // 2) for k in range(39)]
    assert source.stats.read == 20 and source.stats.sampled == 39
    prepared = []
    threaded = list(open_source(video, 4.0).threaded(prepare=lambda image: prepared.append(image) or image[:1]))
    assert len(threaded) == 39 and len(prepared) == 20  # a repeated frame is preprocessed once
    assert threaded[1].tensor is threaded[2].tensor
    assert notes == [f"note: {video} has 2 frames per second, fewer than the 4 the bundle samples: each frame is "
                     "repeated for the sample times it covers, so stream times stay true"]


def test_a_video_at_or_above_the_bundles_rate_is_sampled_as_before(tmp_path):
    video = write_video(tmp_path / "fast.avi", grey_levels(12), fps=4.0)
    frames = list(open_source(video, 2.0).sampled())
    assert [f.time for f in frames] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert [frame_number(f.image) for f in frames] == [0, 2, 4, 6, 8, 10]  # every second frame


@pytest.mark.parametrize("frames, video_fps, bundle_fps", [(20, 2.0, 4.0), (12, 4.0, 2.0), (20, 10.0, 5.0),
                                                        (21, 10.0, 3.0)])
def test_the_progress_bar_total_is_the_number_of_frames_sampling_gives(tmp_path, frames, video_fps, bundle_fps):
    """The total counted to the video's whole length, a sample time past its last frame: a 2-fps video sampled at
    4 fps ended its bar at 39/41."""
    video = write_video(tmp_path / "clip.avi", grey_levels(frames), fps=video_fps)
    source = open_source(video, bundle_fps)
    assert source.duration_frames == len(list(source.sampled()))


def test_the_progress_bar_of_several_sources_counts_to_the_longest_and_stops_at_max_frames(tmp_path):
    """It counted to the first source's samples: a 6-frame video beside a 20-frame one ended its bar at 20/6."""
    from sdqes_edge.cli.stream import expected_steps

    short, long = (open_source(write_video(tmp_path / f"{n}.avi", grey_levels(n), fps=5.0), 5.0) for n in (6, 20))
    assert expected_steps([short, long], None) == 20 and expected_steps([long, short], None) == 20
    assert expected_steps([short, long], 8) == 8 and expected_steps([short], 8) == 6


def test_the_run_command_scores_a_slow_video_at_the_bundles_rate_over_its_whole_length(exported, tmp_path):
    _, bundle = exported  # sampled at 5 fps
    video = write_video(tmp_path / "slow.avi", grey_levels(10), fps=2.0)  # 5 s, the last frame at 4.5 s
    code = "import sys\nfrom sdqes_edge.cli import run\nsys.exit(run(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "run", str(bundle), "--source", str(video), "--query", QUERY,
                           "--scores", str(tmp_path / "s")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"has 2 frames per second, fewer than the {FPS:g} the bundle samples" in done.stderr
    trace = load_scores(next((tmp_path / "s").glob("*.npz")))
    assert trace.fps == FPS and len(trace.probs) == 23  # sample times 0, 0.2 .. 4.4 s (was 10 frames, "2 s")


def test_an_image_folder_streams_numbered_frames_in_the_order_they_were_taken(tmp_path):
    """frame_1 .. frame_12 written without zero padding: a plain name sort streamed frame_1, frame_10, frame_11,
    frame_12, frame_2, ..., silently scrambling the events in time."""
    import cv2

    for k, image in enumerate(grey_levels(12), start=1):
        cv2.imwrite(str(tmp_path / f"frame_{k}.png"), image)
    frames = list(open_source(tmp_path, 1.0).sampled())
    assert [frame_number(f.image) for f in frames] == list(range(12))
    assert [f.time for f in frames] == [float(k) for k in range(12)]



def test_a_still_image_is_refused_with_the_folder_of_frames_to_stream_instead(tmp_path):
    """OpenCV opens kitchen.jpg as a one-frame video: `run` gave one score and '0 alerts', exit 0."""
    import cv2

    cv2.imwrite(str(tmp_path / "kitchen.JPG"), grey_levels(1)[0])
    with pytest.raises(UserError, match=rf"kitchen.JPG is a still image; .* the folder of frames \({tmp_path}\)"):
        open_source(tmp_path / "kitchen.JPG", 1.0)
    assert len(list(open_source(tmp_path, 1.0).sampled())) == 1  # the folder streams it, knowingly

def test_frames_spread_over_a_short_video_are_its_distinct_frames_never_repeats(tmp_path):
    """Calibration asks for more frames than a short video holds: it gets each frame once, as before the sampler
    repeated frames for slow videos, and cycles through them itself."""
    from sdqes_edge.runtime.sources import frames_spread_over

    video = write_video(tmp_path / "short.avi", grey_levels(6), fps=2.0)
    assert [frame_number(image) for image in frames_spread_over(video, 20)] == list(range(6))


class StampedCamera(FrameSource):
    """A live source whose frame k arrives at ``stamps[k]`` seconds of wall-clock time (the sampler reads only the
    stamps, so nothing sleeps); each image carries its frame number."""

    live = True

    def __init__(self, stamps: list[float], fps: float):
        super().__init__("stamped", fps)
        self.stamps = stamps

    def _frames(self):
        for k, stamp in enumerate(self.stamps):
            yield (lambda k=k: np.full((4, 4, 3), k % 256, np.uint8)), stamp


def camera_stamps(rate: float, seconds: float, jitter_s: float = 0.004, seed: int = 0) -> list[float]:
    """A camera's arrival times: one frame every 1 / rate seconds, each a few milliseconds late at random."""
    late = np.random.default_rng(seed).uniform(0.0, jitter_s, int(rate * seconds))
    return [k / rate + float(delay) for k, delay in enumerate(late)]


@pytest.mark.parametrize("camera_fps, bundle_fps", [(30, 1), (30, 10), (15, 15), (10, 4)])
def test_a_live_source_steps_at_the_bundles_rate_however_its_frames_fall(camera_fps, bundle_fps):
    """A live source took the next frame a period after the last one kept, so every step also waited for the next
    frame to arrive: a 15-fps camera at 15 fps stepped 9.5 times a second, a 30-fps camera at 10 fps 8.4, and the
    model's adapters saw time pass slower than they were trained on. Sample times k / fps keep the rate."""
    seconds = 60
    frames = list(StampedCamera(camera_stamps(camera_fps, seconds), bundle_fps).sampled())
    assert len(frames) == seconds * bundle_fps
    assert [f.index for f in frames] == list(range(len(frames)))
    times = np.array([f.time for f in frames])
    assert (np.diff(times) > 0).all()  # at its own arrival time, each frame once
    assert np.abs(times - np.arange(len(frames)) / bundle_fps).max() < 1.0 / camera_fps + 0.004  # on the grid


def test_a_live_source_skips_the_sample_times_a_stall_left_without_frames():
    """A camera that froze from 3 s to 8 s: the frame after the stall steps once, not once per missed sample time
    (a burst of stale frames would put the model behind the world), and the samples go on from there."""
    stamps = [t for t in camera_stamps(30, 10) if not 3.0 <= t < 8.0]
    source = StampedCamera(stamps, 2.0)
    frames = list(source.sampled())
    assert [round(f.time * 2) for f in frames] == [0, 1, 2, 3, 4, 5, 16, 17, 18, 19]  # sample times 0 .. 2.5, 8 .. 9.5
    assert source.stats.sampled == len(frames) == 10


def test_a_file_read_in_a_loop_left_early_stops_its_reader_thread(tmp_path):
    """`for frame in source.threaded(): break`: the reader thread, waiting for room in the queue, stops once the
    iterator is dropped, as a generator's would, instead of holding the decoder until the program exits."""
    import gc

    video = write_video(tmp_path / "clip.avi", sample_frames(80, 48, 64))
    frames = VideoFileSource(video, FPS).threaded(capacity=2)
    next(frames)
    thread = frames._thread
    del frames
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()
