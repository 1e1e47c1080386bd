"""An annotated video written as one file says, while the stream runs, that its disk is nearly full: OpenCV's writer
reports no error, so the video found a full disk only when it closed, hours of it cut off without a word."""

from __future__ import annotations

import shutil
from collections import namedtuple

import numpy as np

from sdqes_edge.runtime import disk_space
from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink

Usage = namedtuple("Usage", "total used free")
MIB = 2**20


def test_a_disk_nearly_full_is_said_once_while_the_video_is_written_and_again_once_there_is_room(tmp_path,
                                                                                                monkeypatch):
    free = {"bytes": 100 * MIB}
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda folder: Usage(10**12, 0, free["bytes"]))
    said = []
    sink = AnnotatedVideoSink(tmp_path / "annotated.avi", 1.0, lambda: {})
    sink.log = said.append
    sink._disk.check_seconds = 0.0  # every frame, where a stream reads the disk every 30 s
    frame = np.zeros((48, 64, 3), np.uint8)
    for t in range(3):
        sink.on_frame(0, frame, float(t), {}, [])
    assert said == [f"warning: the disk the annotated video {tmp_path / 'annotated.avi'} is written to has 100.0 MiB "
                    "free; OpenCV's writer says nothing of a full disk, so the video would be cut off without a word "
                    "until it closes: free some space, or write it to another disk"]
    free["bytes"] = 300 * MIB  # over the mark, not yet twice it: no word either way
    sink.on_frame(0, frame, 3.0, {}, [])
    free["bytes"] = 2 * 1024 * MIB
    sink.on_frame(0, frame, 4.0, {}, [])
    assert said[1:] == [f"note: the disk of the annotated video {tmp_path / 'annotated.avi'} has 2.0 GiB free again"]
    monkeypatch.setattr(disk_space.shutil, "disk_usage", shutil.disk_usage)
    sink.close()


def test_the_free_space_is_read_at_most_every_thirty_seconds_of_the_clock(tmp_path, monkeypatch):
    reads = []
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda folder: reads.append(folder) or Usage(1, 0, 10**12))
    sink = AnnotatedVideoSink(tmp_path / "annotated.avi", 1.0, lambda: {})
    for t in range(50):
        sink.on_frame(0, np.zeros((48, 64, 3), np.uint8), float(t), {}, [])
    assert reads == [tmp_path]  # the first frame's, then not again within 30 s
    monkeypatch.setattr(disk_space.shutil, "disk_usage", shutil.disk_usage)
    sink.close()
