"""One run at a time per alert log and state file, in either runtime. Two runs given the same --state (a service
started again while the first still ran, a second container on one volume) each resumed from and saved over the
other's snapshot, and wrote one alert log between them, without a word. The second is now refused in one line naming
the run that holds the file; a run killed outright leaves a lock file that stops no one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from native_vectors import VECTORS

from sdqes_edge.cli import run
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.errors import UserError
from sdqes_edge.runtime.output_locks import hold, lock_path, release, release_all


class Holder:
    """Another process holding ``path``'s lock, as a run does, until it is killed."""

    def __init__(self, path: Path, option: str = "--events"):
        code = ("import sys, time; from sdqes_edge.runtime.output_locks import hold; "
                f"hold(sys.argv[1], {option!r}); print('held', flush=True); time.sleep(120)")
        self.process = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "held"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)  # a kill -9: no clean-up of any kind
        self.process.wait(timeout=30)


@pytest.fixture
def holder():
    held: list[Holder] = []
    yield lambda path, option="--events": held.append(Holder(path, option)) or held[-1]
    for h in held:
        if h.process.poll() is None:
            h.kill()


def run_refusal(argv: list[str], capsys) -> str:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("option, name", [("--events", "alerts.jsonl"), ("--state", "state.npz"),
                                          ("--save-state", "state.npz"), ("--annotate", "annotated.mp4"),
                                          ("--scores", "trace.npz")])
def test_a_run_on_an_output_another_run_writes_is_refused_naming_that_run(option, name, holder, tmp_path, capsys):
    other = holder(tmp_path / name, option)
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "clip.mp4"), "--query", "q", option,
                       str(tmp_path / name)], capsys)
    assert (f"{option} {tmp_path / name} is being written by another run (pid {other.process.pid}, sdqes-edge); "
            "stop that run, or give this one another file") in err


@pytest.mark.parametrize("first, second, name", [("--events", "--scores", "out.npz"),
                                                  ("--state", "--scores", "out.npz"),
                                                  ("--events", "--annotate", "out.mp4")])
def test_one_file_given_to_two_outputs_of_a_run_is_refused(first, second, name, tmp_path, capsys):
    """Each would have written it in turn: the score trace replaced the alert log as the run ended."""
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "clip.mp4"), "--query", "q",
                       first, str(tmp_path / name), second, str(tmp_path / name)], capsys)
    assert (f"{second} {tmp_path / name} is the file {first} {tmp_path / name} writes too: each output needs a file "
            f"of its own; give {second} another name") in err


@pytest.mark.parametrize("option", ["--annotate", "--events"])
def test_an_output_that_is_the_video_the_run_reads_is_refused_and_the_video_kept(option, tmp_path, capsys):
    """--annotate clip.avi beside --source clip.avi wrote the annotated video over the user's own."""
    video = tmp_path / "clip.avi"
    video.write_bytes(b"the user's own video")
    (tmp_path / "link.avi").symlink_to(video)  # the same file by another name
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "link.avi"), "--query", "q", option,
                       str(video)], capsys)
    assert (f"{option} {video} is the file --source {tmp_path / 'link.avi'} reads: writing there would damage it; "
            f"give {option} another name") in err
    assert video.read_bytes() == b"the user's own video"


def test_sdqes_run_refuses_an_output_that_is_the_video_it_reads(native_build, tmp_path):
    video = tmp_path / "clip.avi"
    video.write_bytes(b"the user's own video")
    for option in ("--events", "--state"):
        done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", str(video),
                               option, str(video)], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr == (
            f"sdqes-run: error: {option} {video} is the file --source {video} reads: writing there would damage it; "
            f"give {option} another name\n"), done.stderr
    assert video.read_bytes() == b"the user's own video"


@pytest.mark.parametrize("option, name", [("--events", "manifest.json"), ("--state", "state.npz"),
                                          ("--annotate", "annotated.mp4")])
def test_an_output_inside_the_bundle_is_refused_and_the_bundle_kept(option, name, tmp_path, capsys):
    """--events bundle/queries.json appended the alerts to the bundle's own file, which then failed its sha256."""
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()}
    err = run_refusal(["run", str(tmp_path / "." / "bundle"), "--source", str(tmp_path / "clip.mp4"), "--query",
                       "q", option, str(bundle / name)], capsys)
    assert (f"{option} {bundle / name} is inside the bundle {tmp_path / '.' / 'bundle'}, which is read, never "
            f"written (a re-export replaces it whole); give {option} a path outside it") in err
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file()} == before


def test_sdqes_run_refuses_an_output_inside_its_bundle(native_build, tmp_path):
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    bundle = VECTORS / "bundle"
    done = subprocess.run([str(native_build / "sdqes-run"), str(bundle), "--source", str(clip), "--events",
                           str(bundle / ".." / "bundle" / "alerts.jsonl")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr == (
        f"sdqes-run: error: --events {bundle / '..' / 'bundle' / 'alerts.jsonl'} is inside the bundle {bundle}, which "
        "is read, never written (a re-export replaces it whole); give --events a path outside it\n"), done.stderr
    assert not (bundle / "alerts.jsonl").exists()


def test_an_output_that_is_the_queries_file_is_refused_and_the_queries_kept(tmp_path, capsys):
    """--events q.csv beside --queries-file q.csv appended every alert to the user's queries."""
    queries = tmp_path / "q.csv"
    queries.write_text("query,response\nwhen the ball rolls,Rolling!\n")
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "clip.mp4"), "--queries-file",
                       str(queries), "--events", str(queries)], capsys)
    assert f"--events {queries} is the file --queries-file {queries} reads: writing there would damage it" in err
    assert queries.read_text() == "query,response\nwhen the ball rolls,Rolling!\n"


def test_one_file_reached_by_two_names_is_one_file(tmp_path, capsys):
    (tmp_path / "log.npz").symlink_to(tmp_path / "trace.npz")
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "clip.mp4"), "--query", "q",
                       "--scores", str(tmp_path / "trace.npz"), "--events", str(tmp_path / "log.npz")], capsys)
    assert f"--scores {tmp_path / 'trace.npz'} is the file --events {tmp_path / 'log.npz'} writes too" in err


def test_a_first_run_into_a_folder_not_made_yet_is_locked_too(holder, tmp_path, capsys):
    """The run makes an output's folders as it starts writing: had the lock waited for them, two runs started at
    once on a new service's paths would both have gone unlocked."""
    other = holder(tmp_path / "new" / "alerts.jsonl")
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "clip.mp4"), "--query", "q", "--events",
                       str(tmp_path / "new" / "alerts.jsonl")], capsys)
    assert f"is being written by another run (pid {other.process.pid}, sdqes-edge)" in err


def test_a_run_killed_outright_leaves_a_lock_that_stops_no_one(holder, tmp_path):
    other = holder(tmp_path / "alerts.jsonl")
    other.kill()
    assert lock_path(tmp_path / "alerts.jsonl").is_file()  # left behind, its lock gone with its process
    assert hold(tmp_path / "alerts.jsonl", "--events") == tmp_path / ".alerts.jsonl.lock"
    assert lock_path(tmp_path / "alerts.jsonl").read_text() == f"{os.getpid()} sdqes-edge\n"


def test_two_links_to_one_file_are_one_file(holder, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "alerts.jsonl").symlink_to(tmp_path / "data" / "alerts.jsonl")  # leads nowhere yet
    holder(tmp_path / "data" / "alerts.jsonl")
    with pytest.raises(Exception, match="is being written by another run"):
        hold(tmp_path / "alerts.jsonl", "--events")


def test_a_device_is_no_file_a_run_keeps_and_is_not_locked():
    assert hold("/dev/null", "--events") is None  # /dev/stdout too: two runs may print to one terminal


def test_sdqes_run_is_refused_an_alert_log_the_python_runtime_writes(native_build, holder, tmp_path):
    """And the Python runtime one that sdqes-run writes: the same lock file, whichever took it."""
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    other = holder(tmp_path / "alerts.jsonl")
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", str(clip),
                           "--events", str(tmp_path / "alerts.jsonl")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert (f"--events {tmp_path / 'alerts.jsonl'} is being written by another run (pid {other.process.pid}, "
            "sdqes-edge)") in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_sdqes_run_refuses_one_file_given_to_its_alert_log_and_its_state(native_build, tmp_path):
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    done = subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", str(clip),
                           "--events", str(tmp_path / "out.npz"), "--state", str(tmp_path / "out.npz")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr == (
        f"sdqes-run: error: --state {tmp_path / 'out.npz'} is the file --events {tmp_path / 'out.npz'} writes too: "
        "each output needs a file of its own; give --state another name\n"), done.stderr


def test_a_run_that_ends_lets_go_and_leaves_no_lock_file_so_the_next_run_in_the_same_process_may_write(tmp_path):
    frames = a_frames_folder(tmp_path, "frames")
    argv = ["run", str(DEMO_BUNDLE), "--source", str(frames), "--query", "q", "--quiet",
            "--events", str(tmp_path / "alerts.jsonl"), "--state", str(tmp_path / "state.npz")]
    assert run(argv) == 0 and run(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alerts.jsonl", "frames", "state.npz"]


def a_frames_folder(tmp_path: Path, name: str = "kitchen") -> Path:
    """A source of one frame, streamed under the folder's name."""
    import cv2
    import numpy as np

    folder = tmp_path / name
    folder.mkdir()
    cv2.imwrite(str(folder / "000.png"), np.zeros((40, 60, 3), np.uint8))
    return folder


def test_a_folder_of_score_traces_is_locked_per_source(holder, tmp_path, capsys):
    """Runs of other sources may share one folder of traces, each writing its own; two runs of one source into it had
    written one trace between them."""
    source, traces = a_frames_folder(tmp_path), tmp_path / "traces"
    holder(traces / "hallway.npz", "--scores")  # another source's run: no matter
    assert run(["run", str(DEMO_BUNDLE), "--source", str(source), "--query", "q", "--quiet",
                "--scores", str(traces)]) == 0
    assert (traces / "kitchen.npz").is_file()
    capsys.readouterr()
    other = holder(traces / "kitchen.npz", "--scores")  # this source's run
    err = run_refusal(["run", str(DEMO_BUNDLE), "--source", str(source), "--query", "q", "--quiet",
                       "--scores", str(traces)], capsys)
    assert (f"--scores {traces / 'kitchen.npz'} is being written by another run (pid {other.process.pid}, "
            "sdqes-edge)") in err


def test_each_sources_own_annotated_video_is_locked(_step_graph_bundles, holder, tmp_path, capsys):
    """Several sources with one --annotate name write one video each beside it (out.kitchen.mp4)."""
    four_streams = _step_graph_bundles[4]
    sources = [a_frames_folder(tmp_path, "kitchen"), a_frames_folder(tmp_path, "hallway")]
    other = holder(tmp_path / "out.hallway.mp4", "--annotate")
    err = run_refusal(["run", str(four_streams), "--source", str(sources[0]), "--source", str(sources[1]),
                       "--query", "q", "--quiet", "--annotate", str(tmp_path / "out.mp4")], capsys)
    assert f"--annotate {tmp_path / 'out.hallway.mp4'} is being written by another run (pid {other.process.pid}" in err


def test_a_link_planted_where_the_lock_file_goes_is_never_followed(tmp_path):
    """The lock file is the program's own, not one the user named: in a shared folder such as /tmp another user may
    plant a link in its place, and following it wrote the pid over the file it led to (a .bashrc)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    lock_path(tmp_path / "alerts.jsonl").symlink_to(victim)
    assert hold(tmp_path / "alerts.jsonl", "--events") is None  # unlocked, as on a file system without locks
    assert victim.read_text() == "the user's own file\n"
    hard = tmp_path / "state.npz"
    os.link(victim, lock_path(hard))  # a file with another name: not written either
    assert hold(hard, "--state") is None and victim.read_text() == "the user's own file\n"


def test_sdqes_run_never_follows_a_link_planted_where_the_lock_file_goes(native_build, tmp_path):
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    lock_path(tmp_path / "alerts.jsonl").symlink_to(victim)
    subprocess.run([str(native_build / "sdqes-run"), str(VECTORS / "bundle"), "--source", str(clip),
                    "--events", str(tmp_path / "alerts.jsonl")], capture_output=True, text=True)
    assert victim.read_text() == "the user's own file\n"


def another_process_may_take(output: Path) -> bool:
    """Whether a process other than this one could take ``output``'s lock now."""
    code = ("import sys; from sdqes_edge.errors import UserError\n"
            "from sdqes_edge.runtime.output_locks import hold, release\n"
            "try:\n    release(hold(sys.argv[1], '--events'))\nexcept UserError:\n    sys.exit(3)")
    done = subprocess.run([sys.executable, "-c", code, str(output)], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 3), done.stderr
    return done.returncode == 0


def library_sinks(path: Path) -> dict:
    from sdqes_edge.runtime import JsonlSink, ScoreTraceRecorder
    from sdqes_edge.runtime.annotated_video import AnnotatedVideoSink

    return {"JsonlSink": lambda: JsonlSink(path / "alerts.jsonl"),
            "ScoreTraceRecorder": lambda: ScoreTraceRecorder(path / "trace.npz", "kitchen", 5.0),
            "AnnotatedVideoSink": lambda: AnnotatedVideoSink(path / "annotated.mp4", 5.0, dict)}


@pytest.mark.parametrize("sink, name", [("JsonlSink", "alerts.jsonl"), ("ScoreTraceRecorder", "trace.npz"),
                                        ("AnnotatedVideoSink", "annotated.mp4")])
def test_a_library_sink_on_a_file_another_process_writes_is_refused_naming_it(sink, name, holder, tmp_path):
    """The library's sinks lock their files as the command line does: two programs of a user's own, each with a
    JsonlSink on one log, wrote it between them."""
    other = holder(tmp_path / name)
    with pytest.raises(UserError, match=rf"^{sink} .*{name} is being written by another run \(pid "
                                        rf"{other.process.pid}, sdqes-edge\)"):
        library_sinks(tmp_path)[sink]()


def test_sinks_of_one_process_on_one_file_share_its_lock_and_the_last_to_close_lets_go(tmp_path):
    """The command line holds --events and its JsonlSink the same file: one lock, counted, never refusing itself."""
    make = library_sinks(tmp_path)["JsonlSink"]
    first, second = make(), make()
    first.close()
    assert not another_process_may_take(tmp_path / "alerts.jsonl")
    second.close()
    second.close()  # a second close lets go of nothing more
    assert another_process_may_take(tmp_path / "alerts.jsonl")
    assert not lock_path(tmp_path / "alerts.jsonl").exists()


def test_a_child_made_by_fork_never_removes_its_parents_lock(tmp_path):
    lock = hold(tmp_path / "alerts.jsonl", "--events")
    try:
        child = os.fork()
        if child == 0:  # what a worker forked from a run does as it ends
            release_all()
            os._exit(0)
        assert os.waitpid(child, 0)[1] == 0
        assert lock.exists() and not another_process_may_take(tmp_path / "alerts.jsonl")
    finally:
        release(lock)
    assert another_process_may_take(tmp_path / "alerts.jsonl")


def test_two_kinds_of_sink_on_one_file_of_a_program_are_refused(tmp_path):
    """A JsonlSink and a ScoreTraceRecorder given one path in one program would write it in turn (the trace replacing
    the log as it closed); sinks of one kind share it, as the command line's option and its sink do."""
    from sdqes_edge.runtime import JsonlSink, ScoreTraceRecorder

    log = JsonlSink(tmp_path / "out.npz")
    try:
        with pytest.raises(UserError, match=r"^ScoreTraceRecorder .*out\.npz is the file JsonlSink writes \(an alert "
                                            r"log\) in this program: each output needs a file of its own; give "
                                            r"ScoreTraceRecorder another path$"):
            ScoreTraceRecorder(tmp_path / "out.npz", "kitchen", 5.0)
        JsonlSink(tmp_path / "out.npz").close()  # another alert log on it: one lock, counted
    finally:
        log.close()
    assert another_process_may_take(tmp_path / "out.npz")


def test_save_state_takes_the_snapshots_lock_while_it_writes(holder, tmp_path):
    """A program saving over the snapshot a service's run --state keeps (or over its own alert log) is refused; each
    write lets go as it ends, on this thread or on the writer's."""
    from sdqes_edge.runtime import JsonlSink
    from sdqes_edge.runtime.detector import StreamingDetector

    detector = StreamingDetector(DEMO_BUNDLE)
    other = holder(tmp_path / "service.npz", "--state")
    with pytest.raises(UserError, match=rf"^save_state .*service\.npz is being written by another run \(pid "
                                        rf"{other.process.pid}, sdqes-edge\)"):
        detector.save_state(tmp_path / "service.npz")
    log = JsonlSink(tmp_path / "alerts.npz")
    with pytest.raises(UserError, match=r"is the file JsonlSink writes \(an alert log\) in this program"):
        detector.save_state(tmp_path / "alerts.npz")
    log.close()
    detector.save_state(tmp_path / "state.npz")
    assert another_process_may_take(tmp_path / "state.npz")
    detector.save_state(tmp_path / "later.npz", wait=False)
    detector.close()  # the write in flight finished
    assert another_process_may_take(tmp_path / "later.npz") and (tmp_path / "later.npz").is_file()


def test_a_run_refused_after_locking_its_outputs_leaves_no_folder_they_alone_made(tmp_path, capsys):
    """A lock is taken in the output's folder, made for it; a run then refused (here: no such source) left that
    folder behind, empty. Folders the run wrote in, or that were there before, are kept."""
    (tmp_path / "kept").mkdir()
    run_refusal(["run", str(DEMO_BUNDLE), "--source", str(tmp_path / "missing.mp4"), "--query", "q",
                 "--events", str(tmp_path / "new" / "logs" / "alerts.jsonl"),
                 "--save-state", str(tmp_path / "kept" / "state.npz")], capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["kept"]
    lock = hold(tmp_path / "made" / "trace.npz", "--scores")
    (tmp_path / "made" / "trace.npz").write_bytes(b"written")
    release(lock)
    assert (tmp_path / "made" / "trace.npz").read_bytes() == b"written"
