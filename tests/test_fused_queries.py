"""A bundle exported with --fuse-queries scores its queries inside the step graph (query embeddings in with every
frame, logits out). The streaming detector, and so `sdqes-edge run`, runs it: it feeds the active queries'
embeddings, rows past them zero, and gives the same probabilities and alerts as the same model exported without
fusing, over many frames with the state carried, through plain runs and through the bound buffers alike. The
graph fixes how many queries it scores, so one more than that is refused, naming the fix; removing one makes room.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from runtime_fixtures import FPS, write_video

from sdqes_edge.cli import run
from sdqes_edge.errors import UserError
from sdqes_edge.runtime.detector import StreamingDetector
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
from sdqes_edge.runtime.sinks import Sink
from sdqes_edge.runtime.sources import VideoFileSource
from sdqes_edge.sample import sample_frames

FUSED = ("When I open the fridge", "Tell me when the lamp turns on.")
OTHER = "when I start cooking"
FRAMES = 40


def export(out, *extra: str):
    assert run(["export", "--preset", "tiny", "--adapter", "qrnn", "--seed", "3", "--fps", str(FPS),
                "--verify-frames", "16", "--quiet", "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """The same model (one seed) exported with its two queries fused, and without; a video of FRAMES samples."""
    root = tmp_path_factory.mktemp("fused")
    queries = [arg for text in FUSED for arg in ("--query", text)]
    fused = export(root / "fused", *queries, "--fuse-queries")
    plain = export(root / "plain", *queries)
    video = write_video(root / "clip.avi", sample_frames(FRAMES, 96, 128), fps=FPS)
    return fused, plain, video


class ScoreLog(Sink):
    """Every frame's p of every active query, by text, and every alert as (text, frame index)."""

    def __init__(self, detector: StreamingDetector):
        self.detector, self.probs, self.alerts = detector, [], []

    def on_frame(self, stream, frame_bgr, time_s, probs, events):
        self.probs.append({self.detector.queries.queries[qid].text: p for qid, p in probs.items()})
        self.alerts += [(e.query, e.frame_index) for e in events]


def stream(detector: StreamingDetector, video, frames: slice = slice(None)) -> ScoreLog:
    log = detector.add_sink(ScoreLog(detector))
    for frame in list(VideoFileSource(video, FPS).sampled())[frames]:
        detector.step([frame])
    return log


def with_queries(detector: StreamingDetector, texts) -> StreamingDetector:
    for text in texts:
        detector.add_query(text, threshold=0.01)  # every frame passes: one alert each, at the first frame
    return detector


def by_text(log: ScoreLog, text: str) -> np.ndarray:
    return np.array([frame[text] for frame in log.probs])


HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.mark.parametrize("device, io_binding", [
    ("cpu", False), ("cpu", True),
    pytest.param("cuda", True, marks=pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu with the CUDA "
                                                        "execution provider (an NVIDIA GPU)")),
], ids=["plain-runs", "bound-buffers", "cuda-graph"])
def test_a_fused_bundle_scores_as_the_same_model_unfused_over_many_frames(bundles, device, io_binding):
    """On a GPU the query input is a bound buffer that each binding's captured CUDA graph reads."""
    fused, plain, video = bundles
    step = OnnxRuntimeStep(fused / "step.fp32.onnx", device=device, io_binding=io_binding)
    assert step.fused_queries and step.cuda_graph == (device == "cuda")
    detector = with_queries(StreamingDetector(fused, backend_instance=step), FUSED)
    detector.warm_up()
    got = stream(detector, video)
    expected = stream(with_queries(StreamingDetector(plain), FUSED), video)
    assert len(got.probs) == FRAMES
    for text in FUSED:
        assert np.abs(by_text(got, text) - by_text(expected, text)).max() < (1e-6 if device == "cpu" else 1e-4)
    assert got.alerts == expected.alerts == [(FUSED[0], 0), (FUSED[1], 0)]


def test_one_query_more_than_the_graph_scores_is_refused_and_removing_one_makes_room(bundles):
    fused, plain, video = bundles
    detector = with_queries(StreamingDetector(fused), FUSED)
    with pytest.raises(UserError, match=r"^this bundle scores at most 2 queries at once, inside its step graph "
                                        r"\(exported with --fuse-queries\), and 2 are active: remove one first, or "
                                        "re-export the bundle without --fuse-queries to ask any number$"):
        detector.add_query(OTHER)
    assert len(detector.queries.queries) == 2  # nothing half-added
    detector.remove_query("q1")
    with_queries(detector, [OTHER])  # any text: the graph takes the embeddings with each frame
    got = stream(detector, video, slice(0, 10))
    expected = stream(with_queries(StreamingDetector(plain), [FUSED[1], OTHER]), video, slice(0, 10))
    for text in (FUSED[1], OTHER):
        assert np.abs(by_text(got, text) - by_text(expected, text)).max() < 1e-6


def test_more_queries_at_once_than_the_graph_has_room_for_are_refused_all_together(bundles):
    fused, _, _ = bundles
    detector = StreamingDetector(fused)
    detector.add_query(FUSED[0])
    with pytest.raises(UserError, match=r"^this bundle scores at most 2 queries at once, .*, and 1 are active, 2 "
                                        "more asked: remove some first, or re-export"):
        detector.add_queries([FUSED[1], OTHER])
    assert list(detector.queries.queries) == ["q1"]  # none of the two added
    assert [q.text for q in detector.add_queries([OTHER])] == [OTHER]


def test_a_fused_bundle_with_one_query_active_scores_it_and_ignores_the_zero_rows(bundles):
    fused, plain, video = bundles
    got = stream(with_queries(StreamingDetector(fused), [OTHER]), video, slice(0, 10))
    expected = stream(with_queries(StreamingDetector(plain), [OTHER]), video, slice(0, 10))
    assert [sorted(frame) for frame in got.probs] == [[OTHER]] * 10
    assert np.abs(by_text(got, OTHER) - by_text(expected, OTHER)).max() < 1e-6


def test_run_streams_a_fused_bundle_with_its_own_queries(bundles, tmp_path, capsys):
    fused, _, video = bundles
    events = tmp_path / "alerts.jsonl"
    assert run(["run", str(fused), "--source", str(video), "--threshold", "0.01", "--events", str(events),
                "--quiet"]) == 0
    assert sorted(line.split('"query": ')[1].split('"')[1] for line in events.read_text().splitlines()) == \
        sorted(FUSED)
    assert run(["run", str(fused), "--source", str(video), *[a for t in (*FUSED, OTHER) for a in ("--query", t)],
                "--quiet"]) == 2
    assert "scores at most 2 queries at once" in capsys.readouterr().err


def test_score_refuses_up_front_a_corpus_whose_videos_ask_more_queries_than_a_fused_bundle_scores(bundles,
                                                                                                  tmp_path, capsys):
    """Each such video failed after loading, and the report said to re-run the same command to retry it."""
    fused, _, _ = bundles
    corpus = tmp_path / "corpus"
    assert run(["synth", "--out", str(corpus), "--train", "0", "--val", "0", "--test", "1", "--seconds", "20"]) == 0
    capsys.readouterr()
    assert run(["score", str(fused), "--annotations", str(corpus / "annotations.csv"), "--videos",
                str(corpus / "videos"), "--out", str(tmp_path / "scores"), "--quiet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"sdqes-edge: error: {fused} scores at most 2 queries at once, inside its step graph (exported with "
        "--fuse-queries), but synthetic-000000 asks 5; re-export the bundle without --fuse-queries to score this "
        "corpus"]
    assert not (tmp_path / "scores").exists()


def test_inspect_points_a_fused_bundle_to_run_and_never_to_build_engine_which_refuses_it(bundles, capsys):
    fused, plain, _ = bundles
    for bundle, engine in ((fused, False), (plain, True)):
        assert run(["inspect", str(bundle), "--frames", "2"]) == 0
        next_line = capsys.readouterr().out.strip().splitlines()[-1]
        assert next_line.startswith(f"next: sdqes-edge run {bundle} --source VIDEO")
        assert ("build-engine" in next_line) == engine
