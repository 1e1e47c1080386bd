"""``sdqes-edge score`` given a video folder that holds none of the annotated videos (the parent folder, another
split's, a folder of clips, a path mistyped into an empty folder) is refused in one line naming the folder to give:
it used to start its workers and fail every stream, one line each (1773 lines for EgoSDQES), then say "re-run the
same command to retry them", which retries nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_corpus import cli

from sdqes_edge.annotations import load_annotations
from sdqes_edge.corpus import plan_streams
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.synthetic import write_dataset


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
