"""A stream that a run stepped goes into the next run with that run's state (the model's memory and each query's
alert state): a second video on one detector was scored on the first's memory, up to 0.35 off in probability, with
no word. ``run(..., carry_state=...)`` says which is meant: False starts the stream afresh (the fresh detector's
scores and next state exactly), True goes on from it (a recording split into files), and None, the default, goes on
with a ``StateCarriedWarning`` that names the fix. A reset or a loaded snapshot is asking already: no warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from runtime_fixtures import write_video

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime import Frame, Sink, StateCarriedWarning, StreamingDetector, open_source
from sdqes_edge.runtime.frame_source import FrameSource
from sdqes_edge.runtime.soak import NoiseSource
from sdqes_edge.runtime.stream_slot import carried_state_words
from sdqes_edge.sample import sample_frames

QUERY = "Tell me when the lamp turns on."


class Scores(Sink):
    """Each frame's probability of the one query, in order."""

    def __init__(self):
        self.probs: list[float] = []

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        self.probs.extend(probs.values())


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("carried")
    frames = sample_frames(60, 96, 128)
    return write_video(folder / "first.avi", frames), write_video(folder / "second.avi", frames[::-1])


def detector() -> StreamingDetector:
    made = StreamingDetector(DEMO_BUNDLE)
    made.add_query(QUERY, threshold=0.5)
    return made


def scored(detector: StreamingDetector, video, **run_options) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The run's probabilities, frame by frame, and the state it left."""
    scores = detector.add_sink(Scores())
    source = video if isinstance(video, FrameSource) else open_source(video, detector.fps)
    for _ in detector.run(source, **run_options):
        pass
    return np.array(scores.probs), detector.backend.state_to_numpy(detector.state)


def assert_same_run(got, expected) -> None:
    np.testing.assert_allclose(got[0], expected[0], atol=1e-6)
    assert got[1].keys() == expected[1].keys()
    for name in expected[1]:
        np.testing.assert_allclose(got[1][name], expected[1][name], atol=1e-6, err_msg=name)


def test_a_second_run_says_it_goes_on_from_the_first_runs_state_and_names_both_fixes(videos):
    first, second = videos
    reused = detector()
    scored(reused, first)
    with pytest.warns(StateCarriedWarning) as said:
        carried = scored(reused, second)
    assert len(said) == 1 and said[0].filename == __file__  # at the loop over the run, not inside the runtime
    assert str(said[0].message).startswith("stream 0 begins second with the state first left (the model's memory")
    assert str(said[0].message).endswith("run(..., carry_state=False) or detector.reset() starts afresh, "
                                         "carry_state=True goes on from it without this warning (a recording split "
                                         "into files)")
    fresh = scored(detector(), second)
    assert np.abs(carried[0] - fresh[0]).max() > 0.05  # what the warning is for: the memory of the first video


def test_carry_state_false_starts_the_second_run_as_a_fresh_detector_does(videos):
    first, second = videos
    reused = detector()
    scored(reused, first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_run(scored(reused, second, carry_state=False), scored(detector(), second))


def test_carry_state_true_goes_on_from_the_first_run_without_a_word(videos):
    first, second = videos
    said_so, on_purpose = detector(), detector()
    scored(said_so, first), scored(on_purpose, first)
    with pytest.warns(StateCarriedWarning):
        expected = scored(said_so, second)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_run(scored(on_purpose, second, carry_state=True), expected)


def test_the_same_video_run_again_is_said_to_begin_again(videos):
    first, _ = videos
    reused = detector()
    scored(reused, first)
    with pytest.warns(StateCarriedWarning, match="^stream 0 begins first again, with the state its earlier run left "):
        scored(reused, first)


def test_a_reset_between_runs_starts_afresh_without_a_warning(videos):
    first, second = videos
    reused = detector()
    scored(reused, first)
    reused.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_run(scored(reused, second), scored(detector(), second))


def test_a_loaded_snapshot_is_gone_on_from_without_a_warning(videos, tmp_path):
    """load_state is asking for that state: the next run goes on from it (a recording split into files)."""
    first, second = videos
    saved = detector()
    scored(saved, first)
    saved.save_state(tmp_path / "state.npz")
    restored = detector()
    restored.load_state(tmp_path / "state.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same_run(scored(restored, second), scored(saved, second, carry_state=True))


@pytest.mark.parametrize("carry_state", ["no", 0, 1.0])
def test_carry_state_other_than_true_false_or_none_is_refused(videos, carry_state):
    """A string is true: "no" would have carried the state."""
    with pytest.raises(UserError, match=rf"^carry_state is True .* or None \(go on, with a warning\), not "
                                        rf"{carry_state!r}$"):
        scored(detector(), videos[0], carry_state=carry_state)


def test_frames_a_program_stepped_itself_are_named_as_such_and_many_streams_are_counted_past_the_first_two():
    """32 streams named one by one made a paragraph of one warning."""

    stepped = detector()
    stepped.step([Frame(np.zeros((48, 64, 3), np.uint8), 0.0, 0)])
    with pytest.warns(StateCarriedWarning, match=r"^stream 0 begins soak with the state of the frames stepped before "
                                                 r"it \(the model's memory"):
        for _ in stepped.run(NoiseSource(stepped.fps, 2)):
            pass
    words = carried_state_words([(k, f"camera{k}", f"camera{k}") for k in range(32)])
    assert words.startswith("stream 0 begins camera0 again, with the state its earlier run left; stream 1 begins "
                            "camera1 again, with the state its earlier run left; 30 more streams likewise (the model's")
    assert "max alerts), so their first scores and alerts depend on what came before; " in words


def test_one_source_given_to_a_second_run_is_read_again_from_its_start_as_a_new_one_is(videos):
    """The stream kept it as already attached: carry_state=False reset nothing, no warning said the state went on,
    and the stream times did not start again, so the first frame raised a FrameRateWarning (time went back)."""
    first, _ = videos
    reused, fresh = detector(), detector()
    source = open_source(first, reused.fps)
    scored(reused, source)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = scored(reused, source, carry_state=False)
    assert_same_run(again, scored(fresh, first))
    with pytest.warns(StateCarriedWarning, match="^stream 0 begins first again, with the state its earlier run left"):
        scored(reused, source)
