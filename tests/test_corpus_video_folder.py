"""``sdqes-edge score`` given a video folder that holds none of the annotated videos (the parent folder, another
split's, a folder of clips, a path mistyped into an empty folder) is refused in one line naming the folder to give:
it used to start its workers and fail every stream, one line each (1773 lines for EgoSDQES), then say "re-run the
same command to retry them", which retries nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_corpus import cli

from sdqes_edge.annotations import load_annotations
from sdqes_edge.corpus import plan_streams
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    write_dataset(out, {"test": [0, 1]}, seconds=20.0, fps=2.0)
    return out


def folder_of(tmp_path: Path, corpus: Path, names: dict[str, str]) -> Path:
    """A folder holding copies of the corpus' videos under other names: {stream: file name}."""
    folder = tmp_path / "videos"
    folder.mkdir()
    for stream, name in names.items():
        shutil.copy(corpus / "videos" / f"{stream}.avi", folder / name)
    return folder


def refusal(corpus: Path, folder: Path) -> str:
    with pytest.raises(UserError) as refused:
        plan_streams(load_annotations(str(corpus / "annotations.csv")), folder)
    return str(refused.value)


def test_an_empty_folder_is_refused_naming_the_file_names_it_should_hold(corpus, tmp_path):
    (tmp_path / "videos").mkdir()
    said = refusal(corpus, tmp_path / "videos")
    assert said.startswith(f"video folder {tmp_path / 'videos'} holds no video (mp4, avi, ")
    assert "give the folder of the 2 annotated videos, each named by its video_uid (e.g. synthetic-000000.mp4)" in said


def test_a_folder_of_other_videos_is_refused_naming_one_of_them(corpus, tmp_path):
    folder = folder_of(tmp_path, corpus, {"synthetic-000000": "kitchen.avi"})
    assert refusal(corpus, folder).startswith(f"none of the 2 annotated videos is in {folder}, whose 1 video(s) (e.g. "
                                              "kitchen.avi) are named otherwise; give the folder of the annotated")


def test_a_folder_of_clips_alone_is_refused_saying_why_a_clip_is_not_its_video(corpus, tmp_path):
    annotations = (corpus / "annotations.csv").read_text()
    clipped = tmp_path / "clipped"
    clipped.mkdir()
    (clipped / "annotations.csv").write_text(annotations.replace("synthetic-000000,synthetic-000000,",
                                                                 "synthetic-000000,clip-a,"))
    folder = folder_of(tmp_path, corpus, {"synthetic-000000": "clip-a.avi"})
    said = refusal(clipped, folder)
    assert said.startswith(f"none of the 2 annotated videos is in {folder}, only clips of 1 of them (e.g. clip-a.avi, "
                           "named by clip_uid): a clip starts part-way into its video")


def test_a_folder_holding_one_of_the_videos_is_scored_and_the_missing_one_fails_alone(corpus, tmp_path):
    folder = folder_of(tmp_path, corpus, {"synthetic-000001": "synthetic-000001.avi"})
    tasks = plan_streams(load_annotations(str(corpus / "annotations.csv")), folder)
    assert [(task.stream, task.video is not None) for task in tasks] == [("synthetic-000000", False),
                                                                        ("synthetic-000001", True)]


def test_score_refuses_the_wrong_folder_in_one_line_before_any_worker_starts(corpus, tmp_path):
    folder = folder_of(tmp_path, corpus, {"synthetic-000000": "kitchen.avi"})
    done = cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos", str(folder),
               "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("sdqes-edge: error: none of the 2 annotated videos is in ") and \
        done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists()  # not a failures.json, not a record of the model


def test_a_video_kept_as_a_folder_of_its_frames_scores_as_the_video_at_the_rate_images_fps_says(corpus, tmp_path):
    """The authors' code keeps each video as <video_uid>/frame_*.jpg at 2 fps. score found none of them; taken one
    image per sample, a 1-fps model would have seen time run twice as fast. With --images-fps 2, each folder is
    sampled by time as its video is, and its trace is the video's (frames kept losslessly, as PNG)."""
    folder = folder_of(tmp_path, corpus, {"synthetic-000001": "synthetic-000001.avi"})
    frames = folder / "nested" / "synthetic-000000"
    frames.mkdir(parents=True)
    capture = cv2.VideoCapture(str(corpus / "videos" / "synthetic-000000.avi"))  # 2 fps, as synth draws it
    count = 0
    while (read := capture.read())[0]:
        cv2.imwrite(str(frames / f"frame_{count:06d}.png"), read[1])
        count += 1
    done = cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos", str(folder),
               "--out", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (f"1 of the 2 annotated videos are folders of frames in {folder} (e.g. {frames}): give --images-fps, the "
            "rate they were extracted at") in done.stderr
    done = cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos", str(folder),
               "--out", str(tmp_path / "out"), "--quiet", "--images-fps", "2", "--workers", "1")
    assert done.returncode == 0, done.stderr
    video = cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos",
                str(corpus / "videos"), "--out", str(tmp_path / "videos-out"), "--quiet", "--workers", "1")
    assert video.returncode == 0, video.stderr
    for stream in ("synthetic-000000", "synthetic-000001"):
        np.testing.assert_array_equal(load_scores(tmp_path / "out" / "traces" / f"{stream}.npz").probs,
                                      load_scores(tmp_path / "videos-out" / "traces" / f"{stream}.npz").probs)
    assert json.loads((tmp_path / "out" / "scored_by.json").read_text())["images_fps"] == 2.0
