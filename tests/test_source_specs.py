"""What `--source` (and ``open_source``) makes of what it is given: a camera index, a URL, a GStreamer pipeline
(elements joined by "!"), an image folder or a video file. A pipeline is run only by an OpenCV built with
GStreamer, which pip's wheels never are: said so, rather than "check it is connected (ls /dev/video*)". A file whose
name holds a "!" is a file, and a name too long for the file system is an error in one line, not an OSError."""

from __future__ import annotations

import re

import pytest
from runtime_fixtures import FPS, write_video

from sdqes_edge.errors import UserError
from sdqes_edge.runtime import live_source, open_source
from sdqes_edge.runtime.sources import VideoFileSource
from sdqes_edge.sample import sample_frames

CSI_CAMERA = ("nvarguscamerasrc sensor-id=0 ! video/x-raw(memory:NVMM), width=1280, height=720 ! nvvidconv ! "
              "video/x-raw, format=BGRx ! videoconvert ! video/x-raw, format=BGR ! appsink")
RTSP_PIPELINE = "rtspsrc location=rtsp://cam/stream latency=0 ! rtph264depay ! avdec_h264 ! videoconvert ! appsink"


@pytest.mark.parametrize("pipeline", [CSI_CAMERA, RTSP_PIPELINE], ids=["csi-camera", "rtspsrc"])
def test_a_pipeline_for_an_opencv_without_gstreamer_is_refused_naming_what_is_missing(pipeline, monkeypatch):
    monkeypatch.setattr(live_source, "opencv_has_gstreamer", lambda: False)
    with pytest.raises(UserError, match=r"^this OpenCV \(.*\) was built without GStreamer, so it cannot run the "
                                        r"pipeline '.*appsink' \(pip's opencv-python wheels never have it\); use an "
                                        r"OpenCV built with GStreamer \(on a Jetson, JetPack's own\)"):
        open_source(pipeline, FPS)


def test_a_pipeline_that_gstreamer_cannot_open_is_pointed_to_gst_launch(monkeypatch):
    monkeypatch.setattr(live_source, "opencv_has_gstreamer", lambda: True)  # as on a Jetson
    monkeypatch.setattr(live_source.LiveSource, "_open", lambda self, reopened=True: None)  # it would not start
    with pytest.raises(UserError, match=r"^OpenCV cannot open the GStreamer pipeline 'nvarguscamerasrc .*'; check it "
                                        "runs in gst-launch-1.0 and ends in appsink"):
        open_source(CSI_CAMERA, FPS)


def test_a_stream_url_that_does_not_open_is_pointed_to_the_url_not_to_a_cameras_device_and_hides_its_password():
    """It was told to "check it is connected (ls /dev/video*)", which is about cameras; and the camera's password,
    part of its URL, went into the journal with the message."""
    url = "rtsp://admin:s3cret@127.0.0.1:9/nothing-listens-here"  # port 9 (discard): refused at once
    shown = re.escape("rtsp://admin:***@127.0.0.1:9/nothing-listens-here")
    with pytest.raises(UserError, match=rf"^OpenCV cannot open stream {shown}; check the URL plays \(ffplay '{shown}', "
                                        r"with the password\)") as refused:
        open_source(url, FPS)
    assert "/dev/video" not in str(refused.value) and "s3cret" not in str(refused.value)


@pytest.mark.parametrize("target, name", [
    (0, "camera0"),
    ("/dev/v4l/by-id/usb-046d_C920_8D2F-video-index0", "usb-046d_C920_8D2F-video-index0"),
    ("rtsp://admin:s3cret@10.0.0.5:554/cam/realmonitor?channel=2&subtype=0",
     "10.0.0.5-554-cam-realmonitor-channel-2-subtype-0"),
    ("http://127.0.0.1:8080/video.mjpg", "127.0.0.1-8080-video.mjpg"),
    ("udp://@:5000", "5000"),
    (CSI_CAMERA, "nvarguscamerasrc-sensor-id-0"),
    (RTSP_PIPELINE, "rtspsrc-location-rtsp-cam-stream-latency-0"),
    ("rtsp://cam/" + "x" * 200, "cam-" + "x" * 60),
])
def test_a_live_source_is_named_for_its_camera_in_a_word_fit_for_a_file_name_without_its_password(target, name):
    """The name titles its alerts and names its output files (out.NAME.mp4, --scores FOLDER/NAME.npz): the whole
    URL made folders of a score trace ('rtsp:/admin:s3cret@10.0.0.5:554/...') and put the password in every alert."""
    assert live_source.live_source_name(target) == name


def test_a_cameras_device_file_is_a_camera_read_live_not_a_video_file():
    """A service names its camera by /dev/v4l/by-id/... (an index changes when cameras are plugged in another
    order): it was opened as a video file (stamped as a file, nothing dropped, no reconnection). /dev/null is a
    character device as a camera's is, and no camera: the words are a camera's."""
    from sdqes_edge.errors import SourceUnavailable

    with pytest.raises(SourceUnavailable, match=r"^OpenCV cannot open camera /dev/null; check it is connected"):
        open_source("/dev/null", FPS)


def test_a_cameras_device_file_not_there_yet_fails_as_a_camera_that_a_restart_may_find():
    """A USB camera found late at boot: exit status 1, which the unit restarts, not 2 (a mistake in the command)."""
    from sdqes_edge.errors import SourceUnavailable

    with pytest.raises(SourceUnavailable, match=r"^OpenCV cannot open camera /dev/v4l/by-id/usb-cam-video-index0; "
                                                r"check it is connected \(ls /dev/video\*\)") as refused:
        open_source("/dev/v4l/by-id/usb-cam-video-index0", FPS)
    assert refused.value.exit_code == 1


def test_a_live_streams_score_trace_lands_in_the_scores_folder_named_for_the_stream(endless_stream, tmp_path):
    import json
    import subprocess
    import sys

    from sdqes_edge.demo import DEMO_BUNDLE

    done = subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", str(DEMO_BUNDLE), "--source", endless_stream,
                           "--query", "The lamp is on.", "--threshold", "0.01", "--max-frames", "3", "--scores",
                           str(tmp_path / "traces"), "--events", str(tmp_path / "alerts.jsonl")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    name = live_source.live_source_name(endless_stream)
    assert [p.name for p in (tmp_path / "traces").iterdir()] == [f"{name}.npz"]
    assert json.loads((tmp_path / "alerts.jsonl").read_text().splitlines()[0])["stream"] == name


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_source_is_refused_not_read_as_the_current_folder(spec, tmp_path, monkeypatch):
    """An unset shell variable (--source "$VIDEO") became Path(""), the current folder: its images were streamed."""
    import cv2
    import numpy as np

    monkeypatch.chdir(tmp_path)
    cv2.imwrite(str(tmp_path / "frame_1.jpg"), np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(UserError, match="^the source is empty; give a video file, an image folder, a camera index"):
        open_source(spec, FPS)


def test_this_opencvs_build_information_is_read_for_gstreamer():
    import cv2

    line = next((line for line in cv2.getBuildInformation().splitlines() if "GStreamer:" in line), "")
    assert live_source.opencv_has_gstreamer() == ("YES" in line)


def test_a_video_whose_name_holds_an_exclamation_mark_is_a_file_not_a_pipeline(tmp_path):
    """It was opened as a live stream: stamped by the wall clock, as fast as it decoded."""
    video = write_video(tmp_path / "clip!.avi", sample_frames(6, 48, 64))
    assert isinstance(open_source(str(video), FPS), VideoFileSource)


def test_a_source_name_too_long_for_a_file_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^source a{300} is neither a file, a folder, a camera index nor a URL$"):
        open_source("a" * 300, FPS)


@pytest.fixture()
def web_folder(tmp_path):
    """tmp_path served over HTTP, as a web server serves a video file."""
    import functools
    from http.server import SimpleHTTPRequestHandler

    from runtime_fixtures import Quiet, serving

    class Files(Quiet, SimpleHTTPRequestHandler):
        pass

    with serving(functools.partial(Files, directory=str(tmp_path))) as address:
        yield tmp_path, address


@pytest.mark.parametrize("suffix", [".avi", ".mp4"])
def test_a_video_file_served_over_http_is_read_as_the_file_it_is(suffix, web_folder):
    """It was read as a live stream: stamped by the wall clock as fast as it decoded, and at its end "reconnected"
    to play again from its start, forever."""
    import numpy as np

    folder, address = web_folder
    write_video(folder / f"kitchen{suffix}", sample_frames(12, 48, 64), fps=FPS)
    served = open_source(f"{address}/kitchen{suffix}?token=abc", FPS)
    assert isinstance(served, VideoFileSource) and served.name == "kitchen" and served.frame_count == 12
    on_disk = list(open_source(str(folder / f"kitchen{suffix}"), FPS).sampled())
    over_http = list(served.sampled())  # ends, as the file does
    assert [(f.index, f.time) for f in over_http] == [(f.index, f.time) for f in on_disk] and len(on_disk) == 12
    assert all(np.array_equal(a.image, b.image) for a, b in zip(over_http, on_disk))


def test_a_live_stream_over_http_stays_live_on_the_one_connection_it_was_opened_with():
    """An IP camera's MJPEG lists no frames; many such cameras take one client at a time, so the connection
    open_source looked at it with is the one the stream is read on."""
    from runtime_fixtures import EndlessMJPEG, serving

    requests = []

    class Counted(EndlessMJPEG):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    with serving(Counted) as address:
        source = open_source(f"{address}/stream.mjpg", FPS)
        assert isinstance(source, live_source.LiveSource)
        frames = source.sampled()
        first = next(frames)
        frames.close()
        assert first.image.shape == (64, 64, 3) and len(requests) == 1


def test_a_video_served_at_a_sites_root_is_named_for_the_site(tmp_path):
    """Outputs are named for their source (alerts, traces, annotated videos): an empty name made '.npz'."""
    from http.server import BaseHTTPRequestHandler

    from runtime_fixtures import Quiet, serving

    video = write_video(tmp_path / "clip.avi", sample_frames(4, 48, 64), fps=FPS).read_bytes()

    class Root(Quiet, BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "video/x-msvideo")
            self.send_header("Content-Length", str(len(video)))
            self.end_headers()
            self.wfile.write(video)

    with serving(Root) as address:
        source = open_source(f"{address}/", FPS)
        assert isinstance(source, VideoFileSource) and source.name == "127.0.0.1"


def test_an_unreadable_image_in_a_folder_is_skipped_and_named_the_next_image_stepping_in_its_place(tmp_path):
    """A recorder killed mid-write leaves its last image half there: the run stopped at it with an error, after
    however many images it had stepped. Now it is skipped, named as met and in the summary, and the timeline
    kept; a folder of no readable image at all is still refused."""
    import cv2
    import numpy as np

    for i in range(5):
        cv2.imwrite(str(tmp_path / f"frame_{i}.png"), np.full((8, 8, 3), 40 * i, np.uint8))
    (tmp_path / "frame_2.png").write_bytes(b"\x89PNG cut short")
    source, said = open_source(tmp_path, 1.0), []
    source.log = said.append
    frames = list(source.sampled())
    assert [(f.index, f.time, int(f.image[0, 0, 0])) for f in frames] == [
        (0, 0.0, 0), (1, 1.0, 40), (2, 2.0, 120), (3, 3.0, 120), (4, 4.0, 160)]  # frame_3 steps in for frame_2
    assert said == [f"warning: OpenCV cannot read the image {tmp_path / 'frame_2.png'}: skipped, the next image steps "
                    "in its place; remove or re-save it"]
    assert source.stats.shortfall_words("frames") == ("frames: 1 image could not be read and was skipped "
                                                      "(frame_2.png), the next image stepping in for each")
    for i in range(5):
        (tmp_path / f"frame_{i}.png").write_bytes(b"")
    source = open_source(tmp_path, 1.0)
    source.log = said.append
    with pytest.raises(UserError, match=f"^OpenCV cannot read any image of {tmp_path} \\(the first: frame_0.png\\)"):
        list(source.sampled())


def test_images_of_one_number_are_said_since_each_is_streamed_and_every_frame_after_comes_late(tmp_path):
    """A folder converted from JPEG to PNG and kept with both: frame_3 was streamed twice, one sample apart, and
    every frame after it came a sample late, each alert's time with it, without a word."""
    import cv2
    import numpy as np

    for i in range(5):
        cv2.imwrite(str(tmp_path / f"frame_{i}.png"), np.full((8, 8, 3), 40 * i, np.uint8))
    cv2.imwrite(str(tmp_path / "frame_3.jpg"), np.zeros((8, 8, 3), np.uint8))
    cv2.imwrite(str(tmp_path / "frame_004.png"), np.zeros((8, 8, 3), np.uint8))
    source, said = open_source(tmp_path, 1.0), []
    source.log = said.append
    assert len(list(source.sampled())) == 7  # each image is still a frame, as asked
    assert said == [f"warning: {tmp_path} holds 2 images of one number (frame_3.jpg, frame_3.png; 1 more number "
                    "repeated): each is streamed as a frame of its own, so every frame after comes late; "
                    "keep one image of each number"]
    for name in ("frame_3.jpg", "frame_004.png"):  # numbered once each: nothing to say
        (tmp_path / name).unlink()
    source, said = open_source(tmp_path, 1.0), []
    source.log = said.append
    assert len(list(source.sampled())) == 5 and said == []


@pytest.mark.parametrize("numbers, says", [
    ([0, 1, 2, 5, 6, 7], "(frame_2.png then frame_5.png) where the others go up by 1"),
    ([0, 1, 3, 4, 6, 7, 8], "(frame_1.png then frame_3.png; 1 more gap) where the others go up by 1"),
    ([0, 30, 60, 90, 150], "(frame_90.png then frame_150.png) where the others go up by 30"),
    ([0, 30, 60, 90, 120], None),  # every 30th frame of a video: one step throughout
    ([1, 2, 3], None),
])
def test_images_whose_numbers_skip_where_the_rest_go_one_by_one_are_said(tmp_path, numbers, says):
    """A frame lost in an export (frame_2, then frame_5): each image is one sample, so every frame after it came
    early, each alert's time with it, without a word."""
    import cv2
    import numpy as np

    for n in numbers:
        cv2.imwrite(str(tmp_path / f"frame_{n}.png"), np.zeros((8, 8, 3), np.uint8))
    source, said = open_source(tmp_path, 1.0), []
    source.log = said.append
    assert len(list(source.sampled())) == len(numbers)
    assert said == ([f"warning: {tmp_path}'s images skip numbers {says}: an image missing is no frame, so every "
                     "frame after comes early; put the missing images back, or a copy of the one before"]
                    if says else [])


def test_a_folder_of_images_taken_at_2_fps_is_sampled_by_time_into_a_1_fps_model(tmp_path):
    """The authors' code extracts frames at 2 fps (frame_000000.jpg, ...). Taken one image per sample, a 1-fps model
    saw time run twice as fast, without a word; with images_fps=2 it gets every other image, at its own time, and a
    resumed run goes on at the sample after, as in a video."""
    import cv2
    import numpy as np

    for i in range(10):
        cv2.imwrite(str(tmp_path / f"frame_{i:06d}.png"), np.full((8, 8, 3), 20 * i, np.uint8))
    source = open_source(tmp_path, 1.0, images_fps=2.0)
    assert source.duration_frames == 5
    assert [(f.index, f.time, int(f.image[0, 0, 0])) for f in source.sampled()] == [
        (0, 0.0, 0), (1, 1.0, 40), (2, 2.0, 80), (3, 3.0, 120), (4, 4.0, 160)]
    resumed = open_source(tmp_path, 1.0, images_fps=2.0)
    resumed.start_at(3)
    assert [(f.index, int(f.image[0, 0, 0])) for f in resumed.sampled()] == [(3, 120), (4, 160)]
    assert resumed.duration_frames == 2
    slower = open_source(tmp_path, 4.0, images_fps=2.0)  # as a video's: sample k / fps by the image at or after it
    assert [int(f.image[0, 0, 0]) for f in slower.sampled()][:4] == [0, 20, 20, 40]
    assert len(list(open_source(tmp_path, 1.0).sampled())) == 10  # unsaid: one image per sample, as before
    # A snapshot knows the folder again only at the same rate: its position, a time, is other images at another.
    assert open_source(tmp_path, 1.0).identity == f"{tmp_path.resolve()} (10 images)"  # as snapshots recorded it
    assert open_source(tmp_path, 1.0, images_fps=2.0).identity == f"{tmp_path.resolve()} (10 images at 2 fps)"
    for i in range(6, 10):  # every image from where a resumed run goes on, unreadable: refused, not an empty stream
        (tmp_path / f"frame_{i:06d}.png").write_bytes(b"")
    resumed = open_source(tmp_path, 1.0, images_fps=2.0)
    resumed.start_at(3)
    resumed.log = lambda line: None
    with pytest.raises(UserError, match="OpenCV cannot read any image of"):
        list(resumed.sampled())


def test_images_fps_is_refused_for_a_source_that_is_no_folder_and_out_of_range(tmp_path):
    video = write_video(tmp_path / "clip.avi", sample_frames(4, 32, 32))
    with pytest.raises(UserError, match=r"images_fps is the rate of an image folder's images; source .*clip.avi is no "
                                        r"folder: leave it out$"):
        open_source(video, 1.0, images_fps=2.0)
    with pytest.raises(UserError, match=r"images_fps is the rate .*'s images were taken at, a positive number of "
                                        r"frames per second up to \d+, not -2"):
        open_source(tmp_path, 1.0, images_fps=-2)


def test_run_samples_a_folder_at_the_rate_images_fps_says_and_warns_where_no_source_is_a_folder(tmp_path, capsys):
    import cv2
    import numpy as np

    from sdqes_edge.cli import run
    from sdqes_edge.demo import DEMO_BUNDLE  # a 1-fps model
    from sdqes_edge.traces import load_scores

    frames = tmp_path / "frames"
    frames.mkdir()
    for i in range(10):
        cv2.imwrite(str(frames / f"frame_{i:06d}.jpg"), np.full((32, 32, 3), 20 * i, np.uint8))
    assert run(["run", str(DEMO_BUNDLE), "--source", str(frames), "--images-fps", "2", "--query", "a lamp",
                "--scores", str(tmp_path / "t.npz"), "--quiet"]) == 0
    assert load_scores(tmp_path / "t.npz").probs.shape == (5, 1)  # 10 images 0.5 s apart: 5 s at 1 fps
    video = write_video(tmp_path / "clip.avi", sample_frames(20, 32, 32), fps=10.0)
    capsys.readouterr()
    assert run(["run", str(DEMO_BUNDLE), "--source", str(video), "--images-fps", "2", "--query", "a lamp",
                "--quiet"]) == 0
    assert ("warning: --images-fps is the rate an image folder's images were taken at, and no --source is a folder "
            "(a video keeps its frames' own times): ignored") in capsys.readouterr().err


def test_a_folder_of_videos_is_refused_naming_them_not_streamed_as_its_one_stray_image(tmp_path):
    """`--source sdqes-demo` (the demo's folder: two videos and a plot) streamed the plot, a run of one frame that
    alerted on nothing, without a word. A folder of frames that keeps its source video beside them still streams."""
    import cv2
    import numpy as np

    for name in ("kitchen.mp4", "hall.avi"):
        (tmp_path / name).write_bytes(b"")  # never opened: the folder's listing is enough
    cv2.imwrite(str(tmp_path / "scores.png"), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(UserError) as refused:
        open_source(tmp_path, 1.0)
    assert str(refused.value) == (f"{tmp_path} holds 2 videos (hall.avi, kitchen.mp4) and 1 image: a folder streams "
                                  "its images as frames, so give a video as the source (--source once for each), or "
                                  "score a folder of annotated videos with `sdqes-edge score`")
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"frame_{i}.png"), np.zeros((8, 8, 3), np.uint8))
    assert open_source(tmp_path, 1.0).duration_frames == 4
