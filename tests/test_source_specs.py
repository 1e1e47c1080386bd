"""What `--source` (and ``open_source``) makes of what it is given: a camera index, a URL, a GStreamer pipeline
(elements joined by "!"), an image folder or a video file. A pipeline is run only by an OpenCV built with
GStreamer, which pip's wheels never are: said so, rather than "check it is connected (ls /dev/video*)". A file whose
name holds a "!" is a file, and a name too long for the file system is an error in one line, not an OSError."""

from __future__ import annotations

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
    monkeypatch.setattr(live_source.LiveSource, "_open", lambda self: None)  # the pipeline would not start
    with pytest.raises(UserError, match=r"^OpenCV cannot open the GStreamer pipeline 'nvarguscamerasrc .*'; check it "
                                        "runs in gst-launch-1.0 and ends in appsink"):
        open_source(CSI_CAMERA, FPS)


def test_a_stream_url_that_does_not_open_is_pointed_to_the_url_not_to_a_cameras_device():
    """It was told to "check it is connected (ls /dev/video*)", which is about cameras."""
    url = "rtsp://127.0.0.1:9/nothing-listens-here"  # port 9 (discard): refused at once
    with pytest.raises(UserError, match=rf"^OpenCV cannot open stream {url}; check the URL plays \(ffplay '{url}'\)") \
            as refused:
        open_source(url, FPS)
    assert "/dev/video" not in str(refused.value)


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
