"""A program that steps its own frames says the order of their colours: `Frame(image, time, index, channels="rgb")`
for PIL, a ROS 2 rgb8 image or most SDKs, OpenCV's BGR where it says nothing. An RGB frame taken for BGR is no error
anyone could see: the model sees a red ball as a blue one and scores otherwise, unsaid."""

from __future__ import annotations

import numpy as np
import pytest

from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime import Frame, Sink, StreamingDetector
from sdqes_edge.runtime.preprocess import CHANNEL_ORDERS, Preprocessor
from sdqes_edge.synthetic import generate_stream

FRAMES = 40  # enough for the adapters' memory to carry every earlier frame's colours into the state
QUERIES = ("Tell me when a purple square appears.", "Let me know when the red ball starts to move.")


@pytest.fixture(scope="module")
def scene() -> np.ndarray:
    """A synthetic stream of coloured squares and balls, [T, H, W, 3] uint8 BGR (drawn with OpenCV)."""
    stream = generate_stream(seed=5, seconds=FRAMES, fps=1.0)
    return stream.frames[:FRAMES]


class ImagesSeen(Sink):
    def __init__(self):
        self.images = []

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        self.images.append(frame_bgr.copy())


def stepped(frames: list[Frame]) -> tuple[StreamingDetector, np.ndarray, np.ndarray, ImagesSeen]:
    """The demo model over ``frames``, state carried: (detector, probabilities [T, Q], embeddings [T, E], sink)."""
    detector = StreamingDetector(DEMO_BUNDLE)
    for query in QUERIES:
        detector.add_query(query)
    seen = detector.add_sink(ImagesSeen())
    probs, embeddings = [], []
    for frame in frames:
        detector.step([frame])
        embeddings.append(detector.last_embeddings[0].copy())
        probs.append(detector.queries.scores(detector.last_embeddings, None)[1][0])
    return detector, np.array(probs), np.array(embeddings), seen


def test_an_rgb_frame_said_to_be_rgb_scores_exactly_as_its_bgr_twin_with_the_state_carried(scene):
    bgr_run = stepped([Frame(image, float(t), t) for t, image in enumerate(scene)])
    rgb_run = stepped([Frame(np.ascontiguousarray(image[:, :, ::-1]), float(t), t, channels="rgb")
                       for t, image in enumerate(scene)])
    np.testing.assert_array_equal(rgb_run[2], bgr_run[2])  # every frame's embedding
    np.testing.assert_array_equal(rgb_run[1], bgr_run[1])
    for name, tensor in bgr_run[0].state.items():  # the next state after the last frame
        np.testing.assert_array_equal(rgb_run[0].state[name], tensor, err_msg=name)


def test_an_rgb_frame_not_said_to_be_rgb_scores_otherwise_which_is_why_the_order_is_said(scene):
    bgr_run = stepped([Frame(image, float(t), t) for t, image in enumerate(scene)])
    unsaid = stepped([Frame(np.ascontiguousarray(image[:, :, ::-1]), float(t), t) for t, image in enumerate(scene)])
    assert np.abs(unsaid[1] - bgr_run[1]).max() > 0.01  # what a user feeding a ROS rgb8 image got, silently


def test_sinks_get_an_rgb_frame_in_opencvs_order_as_they_get_every_other_frame(scene):
    """An annotated video or a program's own overlay draws with OpenCV, which takes BGR: an RGB frame handed on
    as it came was written with red and blue swapped."""
    _, _, _, seen = stepped([Frame(np.ascontiguousarray(image[:, :, ::-1]), float(t), t, channels="rgb")
                             for t, image in enumerate(scene[:3])])
    for got, image in zip(seen.images, scene):
        np.testing.assert_array_equal(got, image)
        assert got.flags["C_CONTIGUOUS"]  # cv2's drawing refuses a reversed view as its output


def test_the_preprocessor_takes_the_order_too(scene):
    preprocess = Preprocessor.from_description(224, {"mean": (0.48, 0.46, 0.41), "std": (0.27, 0.26, 0.28)})
    rgb = np.ascontiguousarray(scene[7][:, :, ::-1])
    np.testing.assert_array_equal(preprocess(rgb, channels="rgb"), preprocess(scene[7]))
    np.testing.assert_array_equal(preprocess.batch([rgb, rgb], "rgb"), preprocess.batch([scene[7]] * 2))


@pytest.mark.parametrize("channels", ["RGB", "rgb8", "gbr", None])
def test_a_channel_order_other_than_bgr_or_rgb_is_refused_before_the_step(scene, channels):
    detector = StreamingDetector(DEMO_BUNDLE)
    with pytest.raises(UserError, match=rf"a Frame's channels name the order of its image's colours, one of "
                                        rf"{', '.join(CHANNEL_ORDERS)}, not {channels!r}$"):
        detector.step([Frame(scene[0], 0.0, 0, channels=channels)])
    with pytest.raises(UserError, match=r"channels names the order of a frame's colours"):
        Preprocessor.from_description(224, {"mean": (0.5,) * 3, "std": (0.5,) * 3})(scene[0], channels=channels)
