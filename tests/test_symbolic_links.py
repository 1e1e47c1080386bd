"""Outputs through symbolic links, as the shell's `>` writes through them: a file or folder replaced whole (a state
snapshot, a score trace, an exported bundle) is replaced where its link leads, and the link kept. The rename had
replaced the link itself: `state.npz -> /data/state.npz` became a file of its own beside a stale one, and an export
to `bundles/current -> v3` made `current` a folder, v3 unchanged, the old link left as `.current.retired-PID`. A link
that leads nowhere yet is made where it points; links in a loop, and a name longer than the file system holds, are
refused in one line (they were tracebacks)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from runtime_fixtures import QUERY, write_video
from test_export_targets import _keep, fp16_bundle  # noqa: F401 (a fixture)

from sdqes_edge.errors import UserError
from sdqes_edge.files import replaced_atomically, staged_directory
from sdqes_edge.path_checks import check_output_dir, check_output_file
from sdqes_edge.sample import sample_frames
from sdqes_edge.traces import load_scores

LONGER_THAN_A_NAME = "a" * 300  # every Linux file system holds 255 bytes a name at most


def test_a_file_replaced_whole_is_replaced_where_its_link_leads_and_the_link_is_kept(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "state.npz").write_text("old")
    (tmp_path / "state.npz").symlink_to("data/state.npz")
    with replaced_atomically(tmp_path / "state.npz") as partial:
        partial.write_text("new")
    assert (tmp_path / "state.npz").is_symlink() and (tmp_path / "data" / "state.npz").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "state.npz"]
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["state.npz"]  # no partial file left


def test_a_link_planted_where_the_partial_copy_goes_is_never_written_through(tmp_path):
    """The partial copy's name (.NAME.partial-PID) can be guessed: a link planted there in a shared folder had the
    block write through it to the file it led to. It is removed and the partial made afresh, never through a link."""
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    (tmp_path / f".state.json.partial-{os.getpid()}").symlink_to(victim)
    with replaced_atomically(tmp_path / "state.json") as partial:
        partial.write_text("{}")
    assert (tmp_path / "state.json").read_text() == "{}" and victim.read_text() == "the user's own file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "victim.txt"]


def test_a_link_that_leads_nowhere_yet_is_made_where_it_points_folders_too(tmp_path):
    (tmp_path / "traces").symlink_to("on-the-card/traces")  # a folder not made yet
    check_output_dir(tmp_path / "traces", "--scores")
    with replaced_atomically(tmp_path / "traces" / "clip.npz") as partial:
        partial.write_text("trace")
    assert (tmp_path / "on-the-card" / "traces" / "clip.npz").read_text() == "trace"


def test_an_export_to_a_link_replaces_the_folder_it_leads_to_and_leaves_nothing_beside_it(tmp_path):
    (tmp_path / "v3").mkdir()
    (tmp_path / "v3" / "manifest.json").write_text("old bundle")
    (tmp_path / "current").symlink_to("v3")
    with staged_directory(tmp_path / "current") as staging:
        (staging / "manifest.json").write_text("new bundle")
    assert (tmp_path / "current").is_symlink() and (tmp_path / "v3" / "manifest.json").read_text() == "new bundle"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "v3"]


@pytest.mark.parametrize("check, example", [(check_output_file, "alerts.jsonl"), (check_output_dir, None)])
def test_links_in_a_loop_and_a_name_too_long_are_refused_up_front_naming_the_option(check, example, tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    args = ("--events", example) if example else ("--scores",)
    with pytest.raises(UserError, match=r"leads round a loop of symbolic links \(.*\); give a path whose links end "):
        check(tmp_path / "a" / "out", *args)
    with pytest.raises(UserError, match=r"has a name longer than its file system holds \(File name too long: most "
                                        r"hold 255 bytes a name\); give a shorter name"):
        check(tmp_path / LONGER_THAN_A_NAME, *args)


def test_the_command_line_says_each_in_one_line_and_writes_through_links(exported, tmp_path):
    _, bundle = exported
    video = write_video(tmp_path / "clip.avi", sample_frames(10, 48, 64))
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sdqes_edge.cli", "run", *args], capture_output=True, text=True)

    for args, said in [((str(bundle), "--events", str(tmp_path / "a" / "alerts.jsonl")),
                        f"--events {tmp_path / 'a' / 'alerts.jsonl'} leads round a loop of symbolic links"),
                       ((str(bundle), "--annotate", str(tmp_path / f"{LONGER_THAN_A_NAME}.mp4")),
                        "has a name longer than its file system holds"),
                       ((str(tmp_path / "a"),), f"bundle {tmp_path / 'a'} leads round a loop of symbolic links"),
                       ((str(tmp_path / LONGER_THAN_A_NAME),),  # the bundle: said by its own check
                        f"bundle {tmp_path / LONGER_THAN_A_NAME} has a name longer than its file system holds"),
                       ((str(bundle), "--resume", str(tmp_path / f"{LONGER_THAN_A_NAME}.npz")),  # by the last net
                        f"{tmp_path / LONGER_THAN_A_NAME}.npz has a name longer than its file system holds")]:
        done = run(*args, "--source", str(video), "--query", QUERY, "--quiet")
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert said in done.stderr, done.stderr
    (tmp_path / "scores").symlink_to("card/scores")
    (tmp_path / "card").mkdir()
    done = run(str(bundle), "--source", str(video), "--query", QUERY, "--quiet", "--scores", str(tmp_path / "scores"))
    assert done.returncode == 0, done.stderr
    assert load_scores(tmp_path / "card" / "scores" / "clip.npz").probs.shape[0] == 5
    assert np.isfinite(load_scores(tmp_path / "scores" / "clip.npz").probs).all()


def test_an_engine_or_sidecar_linked_out_of_the_bundle_is_refused_and_the_file_outside_untouched(
        fp16_bundle, tmp_path):  # noqa: F811
    """Files replaced whole are replaced where their links lead (files.through_links): inside a bundle, someone
    else's data, a link must not lead a write out of it."""
    from sdqes_edge.runtime.bundle import BundleError

    bundle, _ = fp16_bundle
    engine = _keep(bundle, b"good engine", bundle.step_graph("fp16"))
    outside = tmp_path / "outside.json"
    outside.write_text("the user's")
    engine.with_suffix(".json").unlink()
    engine.with_suffix(".json").symlink_to(outside)
    with pytest.raises(BundleError, match="leads outside the bundle through a symlink"):
        _keep(bundle, b"next engine", bundle.step_graph("fp16"))
    assert outside.read_text() == "the user's" and engine.read_bytes() == b"good engine"
