"""The Python API refuses what would otherwise fail deep inside or, worse, run wrong: each mistake a one-line
UserError that says what to pass instead."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sdqes_edge.errors import SetupWarning, UserError
from sdqes_edge.runtime import (
    AnnotatedVideoSink,
    CallbackSink,
    ConsoleSink,
    Frame,
    JsonlSink,
    ScoreTraceRecorder,
    StreamingDetector,
)


@pytest.fixture(scope="module")
def detector(exported):
    _, bundle = exported
    return StreamingDetector(bundle)


def test_an_image_in_place_of_a_frame_is_refused_with_the_wrapping_to_use(detector):
    image = np.zeros((48, 64, 3), np.uint8)
    with pytest.raises(UserError, match=r"step takes one Frame .* not a ndarray: wrap an image as .*Frame\(image="):
        detector.step([image])
    detector.step([Frame(image=image, time=0.0, index=0)])  # what it says to do works


def test_a_float_image_is_refused_rather_than_seen_as_a_black_one(detector):
    """A float image in [0, 1] read as 8-bit grey levels would be near black: alerts would be silently wrong."""
    image = np.full((48, 64, 3), 0.5, np.float32)
    with pytest.raises(UserError, match=r"expected a uint8 BGR frame .* got float32; .*astype\(numpy.uint8\)"):
        detector.step([Frame(image=image, time=0.0, index=0)])


def test_a_16_bit_image_is_refused_with_the_division_that_makes_it_8_bit(detector):
    """The advice for [0, 1] floats, applied to a 16-bit image (a PNG of a machine-vision camera), saturates it
    white; what it says instead gives the same picture in 8 bits."""
    image = np.full((48, 64, 3), 40000, np.uint16)
    with pytest.raises(UserError, match=r"got uint16; for a 16-bit image, pass \(image // 256\)\.astype"):
        detector.step([Frame(image=image, time=0.0, index=0)])
    detector.step([Frame(image=(image // 256).astype(np.uint8), time=0.0, index=0)])


def test_resetting_a_stream_the_bundle_does_not_step_is_refused(detector):
    with pytest.raises(UserError, match="stream 1 is not one of this bundle's streams, 0 to 0"):
        detector.reset(stream=1)
    with pytest.raises(UserError, match="stream -1 is not one of"):
        detector.reset(stream=-1)
    detector.reset(stream=0)


def test_a_frame_without_a_finite_time_is_refused(detector):
    """Alerts, their cooldowns and the traces are timed by the frame's time: a NaN would pass every comparison."""
    with pytest.raises(UserError, match="a Frame's time is seconds into its stream, a finite number, not nan"):
        detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=float("nan"), index=0)])
    with pytest.raises(UserError, match="a Frame's time is seconds into its stream, a finite number, not '1.5'"):
        detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time="1.5", index=0)])  # was a TypeError


def test_a_frame_index_that_is_no_count_from_0_is_refused(detector):
    """The index is where a resumed file goes on (a snapshot records the frame after it): a string failed in an
    addition (TypeError), a negative one was saved as the place to resume."""
    stepped = detector.streams[0].frames
    for index in ("7", -5, 2.0, True):
        with pytest.raises(UserError, match=f"a Frame's index counts the stream's frames from 0, not {index!r}"):
            detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=0.0, index=index)])
    assert detector.streams[0].frames == stepped  # nothing stepped


@pytest.mark.parametrize("option, value, words", [
    ("threshold", "0.6", "threshold is a number, not '0.6'"), ("cooldown_s", "5", "cooldown is a number, not '5'"),
    ("exit_threshold", True, "exit threshold is a number, not True"),
    ("max_alerts", 1.5, "max alerts is a whole number of alerts, not 1.5"),
])
def test_an_alert_policy_of_text_or_fractions_is_refused_in_words(detector, option, value, words):
    """A value read from a config file as text failed in a comparison (TypeError: '<' not supported)."""
    with pytest.raises(UserError, match=words):
        detector.add_query("when the kettle boils", **{option: value})
    assert detector.queries.ids == []


def test_an_alert_policy_of_numpy_numbers_is_kept_as_plain_numbers_that_a_snapshot_can_save(exported, tmp_path):
    """A threshold read from an array (np.float32) made save_state fail on its JSON, at the end of the run."""
    _, bundle = exported
    detector = StreamingDetector(bundle)
    query = detector.add_query("when the kettle boils", threshold=np.float32(0.6), cooldown_s=np.float64(2.0),
                               max_alerts=np.int64(3))
    assert [type(v) for v in (query.policy.threshold, query.policy.cooldown_s, query.policy.max_alerts)] == \
        [float, float, int]
    detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=0.0, index=0)])
    resumed = StreamingDetector(bundle)
    resumed.add_query("when the kettle boils", threshold=float(np.float32(0.6)), cooldown_s=2.0, max_alerts=3)
    resumed.load_state(detector.save_state(tmp_path / "state.npz"))
    assert resumed.streams[0].frames == 1


def test_a_folder_given_to_save_state_is_refused_rather_than_written_beside(detector, tmp_path):
    with pytest.raises(UserError, match=r"is a folder; give save_state a file path \(e.g. .*state.npz\)"):
        detector.save_state(tmp_path)
    assert list(tmp_path.parent.glob(f"{tmp_path.name}.npz")) == []  # numpy wrote FOLDER.npz


def test_a_snapshot_saved_into_folders_that_do_not_exist_yet_makes_them(detector, tmp_path):
    """`run --save-state runs/today/state.npz` was accepted up front, streamed to the end, then lost the state in
    a FileNotFoundError traceback: the alert log and score trace beside it make their folders, the snapshot did not."""
    snapshot = detector.save_state(tmp_path / "runs" / "today" / "state.npz")
    assert snapshot.is_file() and sorted(p.name for p in snapshot.parent.iterdir()) == ["state.npz"]
    detector.load_state(snapshot)


def test_a_snapshot_interrupted_while_it_is_rewritten_stays_the_one_it_was(detector, tmp_path, monkeypatch):
    """`run --resume S --save-state S` rewrites its snapshot as it stops; a second Ctrl-C then landed mid-write and
    left a truncated file in place of the good one."""
    snapshot = detector.save_state(tmp_path / "state.npz")
    before = snapshot.read_bytes()
    detector.step([Frame(image=np.full((48, 64, 3), 200, np.uint8), time=1.0, index=1)])  # a different state

    def savez_stopped_half_way(fh, **arrays):
        fh.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", savez_stopped_half_way)
    with pytest.raises(KeyboardInterrupt):
        detector.save_state(snapshot)
    assert snapshot.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["state.npz"]
    monkeypatch.undo()
    detector.load_state(snapshot)


def test_a_precision_that_does_not_exist_and_a_query_that_is_not_text_are_named_for_what_they_are(exported):
    _, bundle = exported
    with pytest.raises(UserError, match=r"precision 'fp64' is not one of fp32, fp16, int8$"):  # was: re-export
        StreamingDetector(bundle, precision="fp64")                                           # with fp64
    with pytest.raises(UserError, match=r"a query is text, not int"):  # was: "a query is empty"
        StreamingDetector(bundle).add_query(123)


@pytest.mark.parametrize("image, words", [
    (np.zeros((0, 64, 3), np.uint8), r"got an empty frame of shape \(0, 64, 3\); give an image at least 1x1"),
    (np.zeros((48, 0, 3), np.uint8), r"got an empty frame of shape \(48, 0, 3\)"),
    ([[[0, 0, 0]]], r"expected a BGR frame as a numpy array \[H, W, 3\], got a list; .*numpy.asarray\(image\)"),
    (None, r"got a NoneType"),
    (np.zeros((48, 64), np.uint8), r"got shape \(48, 64\); for a grey image, pass cv2.cvtColor\(image, cv2.COLOR_GRAY"),
    (np.zeros((48, 64, 4), np.uint8), r"got shape \(48, 64, 4\); for a BGRA image, drop its alpha: image\[:, :, :3\]$"),
    (np.zeros((3, 48, 64), np.uint8), r"got shape \(3, 48, 64\); for a channels-first image .*transpose\(1, 2, 0\)$"),
    (np.zeros((1, 48, 64, 3), np.uint8), r"got shape \(1, 48, 64, 3\); for a batch of one image .*pass image\[0\]"),
])
def test_an_empty_grey_or_bgra_frame_or_one_that_is_no_array_is_refused_in_words(detector, image, words):
    """An empty frame divided by its zero side (ZeroDivisionError); a PIL image or a list failed inside numpy; a
    grey, BGRA, channels-first or batched image is refused with the conversion that makes it a BGR frame."""
    with pytest.raises(UserError, match=words):
        detector.step([Frame(image=image, time=0.0, index=0)])


def test_a_thread_count_below_one_is_refused_and_one_above_the_cores_is_brought_down_to_them(exported):
    """ONNX Runtime read 0 and -1 as "every core" without a word, and started 10,000 threads for minutes."""
    from sdqes_edge.runtime.cores import usable_cores

    _, bundle = exported
    for threads in (0, -1, 2.5):
        with pytest.raises(UserError, match=rf"threads is a whole number of at least 1 .*, not {threads}$"):
            StreamingDetector(bundle, threads=threads)
    cores = usable_cores()
    # A SetupWarning, not a print: a program can filter it, or make it an error.
    with pytest.warns(SetupWarning, match=rf"^{cores + 7} threads asked of ONNX Runtime, but this process may use "
                                          rf"{cores} core\(s\); using {cores} ") as caught:
        detector = StreamingDetector(bundle, threads=cores + 7)
    assert detector.backend.session.get_session_options().intra_op_num_threads == cores and len(caught) == 1


def test_each_call_names_what_it_takes_when_given_something_else(detector):
    """Each of these failed deep inside (TypeError, AttributeError) or, for a sink, only at the first alert."""
    frame = Frame(image=np.zeros((48, 64, 3), np.uint8), time=0.0, index=0)
    with pytest.raises(UserError, match=r"step takes a list of frames, .* not a Frame: detector.step\(\[frame\]\)"):
        detector.step(frame)
    with pytest.raises(UserError, match=r"add_sink takes a Sink, not a function; .* CallbackSink\(function\)"):
        detector.add_sink(lambda alert: None)
    with pytest.raises(UserError, match=r"a query's message is text \(or None\), not int"):
        detector.add_query("the door opens", message=5)
    with pytest.raises(UserError, match=r"reset takes a stream's index \(an int\) or None .*, not '0'"):
        detector.reset("0")
    with pytest.raises(UserError, match=r"run takes sources, not a str: open_source\('clip.mp4', detector.fps\)"):
        next(detector.run("clip.mp4"))
    with pytest.raises(UserError, match=r"run takes at least one source: detector.run\(\[open_source"):
        next(detector.run([]))  # it ended at once, silently
    for max_frames in (0, -1, "3"):  # 0 and -1 stepped one frame; "3" failed after it (TypeError)
        with pytest.raises(UserError, match=f"max_frames is a number of steps, at least 1 .*, not {max_frames!r}"):
            next(detector.run([], max_frames=max_frames))
    with pytest.raises(UserError, match="truncate_queries is True or False, not 'no'"):
        StreamingDetector(detector.bundle, truncate_queries="no")  # "no" was taken as yes
    for call, name in ((detector.save_state, "save_state"), (detector.load_state, "load_state"),
                       (StreamingDetector, "a bundle is"), (JsonlSink, "JsonlSink takes")):
        with pytest.raises(UserError, match=f"^{name}.* a path \\(a str or a pathlib.Path\\), not a int$"):
            call(5)  # Path's TypeError: "expected str, bytes or os.PathLike object, not int"
    assert detector.queries.ids == [] and detector.sinks == []  # nothing half-added


def test_a_source_samples_at_a_positive_rate_and_opens_from_a_path_or_a_camera_number(tmp_path):
    import cv2

    from sdqes_edge.runtime import open_source
    from sdqes_edge.runtime.sources import ImageFolderSource

    cv2.imwrite(str(tmp_path / "000.png"), np.zeros((8, 8, 3), np.uint8))
    # A NaN rate sampled every frame, a negative one too; 1e300 stepped the first frame without end.
    for fps in (0, -1.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(UserError, match=rf"a source samples at a positive number of frames per second up to 1000, "
                                            rf"not {re.escape(str(fps))}; give the bundle's \(detector.fps\)"):
            open_source(tmp_path, fps)
    assert isinstance(open_source(tmp_path, 1.0), ImageFolderSource)  # a Path (was: no attribute 'isdigit')
    with pytest.raises(UserError, match="OpenCV cannot open camera index 3;"):  # a camera number, as "3" is
        open_source(3, 1.0)


def test_a_query_added_again_while_active_warns_that_each_event_would_alert_twice(exported):
    """A client that re-adds its queries on every reconnect got two alerts for every event, and no word."""
    import warnings

    from sdqes_edge.runtime import DuplicateQueryWarning

    detector = StreamingDetector(exported[1])
    first = detector.add_query("When I open the fridge")
    with pytest.warns(DuplicateQueryWarning, match=f"already active as {first.id} under the same alert policy") as seen:
        detector.add_query("when I  open the fridge ")  # case and spacing aside, the same query
    assert seen[0].filename == __file__  # pointing at the program's call of add_query
    with warnings.catch_warnings():
        warnings.simplefilter("error", DuplicateQueryWarning)
        detector.add_query("When I open the fridge", threshold=0.7)  # another policy: asked on purpose
        detector.remove_query(first.id)
        detector.remove_query("q2")
        detector.add_query("When I open the fridge")  # no longer active under the default policy


def test_a_threshold_outside_the_scores_p_can_take_is_said_once_each_pointing_at_the_programs_call(exported):
    """p = sigmoid(cos) lies in [0.2689, 0.7311]: a query at 0.9 (a detector's usual confidence) never alerted, and
    one at 0.1 alerted at its first frame alone, without a word."""
    import warnings

    from sdqes_edge.runtime import ThresholdOutOfReachWarning

    detector = StreamingDetector(exported[1])
    never = (r"^the threshold 0.9 of query q1 \('When I open the fridge', and of any query given it after\) is never "
             r"reached: p = sigmoid\(cos\) is at most 0.7311 \(a cosine is at most 1\), so the query never alerts; "
             r"give one between 0.2689 and 0.7311")
    with pytest.warns(ThresholdOutOfReachWarning, match=never) as seen:
        detector.add_query("When I open the fridge", threshold=0.9)
    assert seen[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", ThresholdOutOfReachWarning)
        detector.add_query("When I start cooking", threshold=0.9)  # said once for 0.9, not once a query
        calm = detector.add_query("When I wash my hands", threshold=0.7)
    with pytest.warns(ThresholdOutOfReachWarning, match=r"threshold 0.1 of query q3 .* is below every score: p = "
                      r"sigmoid\(cos\) is at least 0.2689 .* alerts at its first frame and never again") as seen:
        detector.set_query_policy(calm, threshold=0.1)
    assert seen[0].filename == __file__


def test_a_state_snapshot_that_cannot_be_written_is_one_line(detector, tmp_path):
    with pytest.raises(UserError, match=r"^save_state /proc/state.npz cannot be written: /proc refuses new files"):
        detector.save_state("/proc/state.npz")
    (tmp_path / "run1").mkdir()
    with pytest.raises(UserError, match="is a folder; give save_state a file path"):
        detector.save_state(tmp_path / "run1")


@pytest.mark.parametrize("make, says", [
    (lambda t: JsonlSink("/proc/alerts.jsonl"), r"^JsonlSink /proc/alerts.jsonl cannot be written: /proc refuses"),
    (lambda t: JsonlSink(t), r"^JsonlSink .* is a folder; give a file path in it \(e.g. .*alerts.jsonl\)$"),
    (lambda t: AnnotatedVideoSink(t / "out.txt", 1.0, dict), r"^AnnotatedVideoSink .*out.txt: OpenCV writes videos as"),
    (lambda t: ScoreTraceRecorder("/proc/s.npz", "s", 1.0), r"^ScoreTraceRecorder /proc/s.npz cannot be written"),
    (lambda t: CallbackSink("print"), r"^CallbackSink takes a function of each alert .* not a str"),
    # A rate of 0 was taken: the video then failed at its first frame as a path "to end in .avi, .mp4, ...",
    # and the trace recorded fps 0, which no evaluation can time.
    (lambda t: AnnotatedVideoSink(t / "out.mp4", 0.0, dict), r"^AnnotatedVideoSink writes at a positive number of "
                                                             r"frames per second up to 1000, not 0.0; give the"),
    (lambda t: ScoreTraceRecorder(t / "s.npz", "s", "1"), r"^ScoreTraceRecorder records at a positive number of "
                                                          r"frames per second up to 1000, not '1'"),
    (lambda t: ConsoleSink(5), r"^ConsoleSink takes a function that writes a line .* not a int$"),
    (lambda t: AnnotatedVideoSink(t / "out.mp4", 1.0, {"q1": 0.6}),
     r"^AnnotatedVideoSink takes thresholds as a function \(detector.thresholds\), not a dict$"),
    # A stream named by a string never matched one: the video or the trace stayed empty, without a word.
    (lambda t: AnnotatedVideoSink(t / "out.mp4", 1.0, dict, stream="0"),
     r"^AnnotatedVideoSink records one of the detector's streams, by its index from 0, not '0'$"),
    (lambda t: ScoreTraceRecorder(t / "s.npz", "s", 1.0, stream=-1), r"^ScoreTraceRecorder records one of the "),
    # Written, and never read: eval finds a folder's traces by their suffix, and matches their stream by its name.
    (lambda t: ScoreTraceRecorder(t / "s.txt", "s", 1.0), r"^ScoreTraceRecorder writes a .npz trace \(eval reads a "
                                                          r"folder's \*.npz\), not s.txt; give .*s.npz$"),
    (lambda t: ScoreTraceRecorder(t / "s.npz", 7, 1.0), r"^ScoreTraceRecorder's stream_name is text .*, not 7$"),
])
def test_a_sink_that_could_never_write_is_refused_when_made_not_at_its_first_alert(make, says, tmp_path):
    """They were accepted and failed later with an OSError or a TypeError: at the first alert, maybe hours in."""
    with pytest.raises(UserError, match=says):
        make(tmp_path)


def test_a_sink_of_a_stream_the_bundle_does_not_step_is_refused_when_added(detector, tmp_path):
    """It was added, and recorded nothing: no video was written, the trace held no frame."""
    for sink in (AnnotatedVideoSink(tmp_path / "out.mp4", detector.fps, detector.thresholds, stream=1),
                 ScoreTraceRecorder(tmp_path / "s.npz", "s", detector.fps, stream=3)):
        with pytest.raises(UserError, match=f"^{type(sink).__name__} records stream {sink.stream}, but this bundle "
                                            r"steps 1 stream\(s\), 0 to 0$"):
            detector.add_sink(sink)
    assert detector.sinks == []


def test_a_score_trace_made_at_another_rate_than_the_detector_steps_is_refused_when_added(detector, tmp_path):
    """Its row k is the score at k / fps: made at 5 fps for a detector stepping at 1, eval timed every score wrong."""
    other = detector.fps * 5
    with pytest.raises(UserError, match=f"^ScoreTraceRecorder records at {other:g} frames per second, but the "
                                        f"detector steps at {detector.fps:g}: .*make it at detector.fps$"):
        detector.add_sink(ScoreTraceRecorder(tmp_path / "s.npz", "s", other))
    assert detector.sinks == []


def test_a_programs_own_sink_and_run_statistics_come_from_the_public_runtime(exported, tmp_path):
    """What a program needs to plug in its own output (a ROS publisher, a headset's overlay) and read how fast the
    stream ran is importable from ``sdqes_edge.runtime``: ``add_sink`` takes only a ``Sink``, and ``run`` fills a
    ``RunStats``. Both had to be fetched from the runtime's inner modules."""
    from runtime_fixtures import write_video

    from sdqes_edge.runtime import RunStats, Sink, open_source

    class Published(Sink):
        def __init__(self):
            self.frames, self.queries = [], []

        def on_query_added(self, query_id, text, asked_time):
            self.queries.append(text)

        def on_frame(self, stream, frame_bgr, time_s, probs, events):
            self.frames.append((stream, time_s, sorted(probs)))

    detector = StreamingDetector(exported[1])
    query = detector.add_query("When I open the fridge")
    published = detector.add_sink(Published())
    video = write_video(tmp_path / "clip.avi", np.zeros((10, 48, 64, 3), np.uint8), fps=5.0)
    stats = RunStats()
    for _ in detector.run(open_source(video, detector.fps), stats):
        pass
    assert published.queries == ["When I open the fridge"]
    assert [(s, round(t, 6), ids) for s, t, ids in published.frames] == [(0, k / 5.0, [query.id]) for k in range(10)]
    assert stats.frames == 10 and stats.latency(50) > 0


def test_each_logged_alert_says_when_it_was_raised_in_utc(exported, tmp_path):
    """stream_time counts from the stream's start, which a restarted run or a reconnected camera moves: a live
    stream's alert log also holds the wall-clock time of each alert, ISO 8601 in UTC (as the native runtime's)."""
    import json
    from datetime import datetime, timezone

    detector = StreamingDetector(exported[1])
    detector.add_query("When I open the fridge", threshold=0.01)  # above it from the first frame: one alert
    detector.add_sink(JsonlSink(tmp_path / "alerts.jsonl"))
    before = datetime.now(timezone.utc)
    detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=0.0, index=0)])
    after = datetime.now(timezone.utc)
    detector.close()
    (alert,) = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert alert["wall_time"].endswith("Z") and len(alert["wall_time"]) == len("2026-11-27T22:10:03.123Z")
    raised = datetime.fromisoformat(alert["wall_time"].replace("Z", "+00:00"))
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= raised <= after


def test_a_sink_that_raises_keeps_the_alert_from_no_other_sink_and_the_step_still_raises_it(exported, tmp_path):
    """A program's callback with a bug (or the console on a closed pipe) came before the alert log, which then
    never had the alert; now every sink has the step, and the first failure is raised after."""
    import json

    def broken(alert):
        raise RuntimeError("the notifier's bug")

    detector = StreamingDetector(exported[1])
    detector.add_query("When I open the fridge", threshold=0.01)  # above it from the first frame: one alert
    detector.add_sink(CallbackSink(broken))
    detector.add_sink(JsonlSink(tmp_path / "alerts.jsonl"))
    with pytest.raises(RuntimeError, match="the notifier's bug"):
        detector.step([Frame(image=np.zeros((48, 64, 3), np.uint8), time=0.0, index=0)])
    detector.close()
    (alert,) = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert alert["query"] == "When I open the fridge"
