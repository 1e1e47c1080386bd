"""``sdqes-edge score``: a corpus scored by a worker pool or on Ray gives, stream by stream, exactly the trace
``sdqes-edge run --scores`` gives; failures are named and the rest carry on; an interrupted run resumes."""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_fixtures import another_run_writing

from sdqes_edge.annotations import by_video, load_annotations
from sdqes_edge.corpus import SCRATCH_PREFIX
from sdqes_edge.corpus_ray import BUNDLE_COPY_PREFIX
from sdqes_edge.demo import DEMO_BUNDLE
from sdqes_edge.files import scratch_directory
from sdqes_edge.synthetic import write_dataset
from sdqes_edge.traces import load_scores

STREAMS = 4


def cli(*args: str, **popen) -> subprocess.CompletedProcess:
    # errors="replace": OpenCV's AVI parser writes the raw bytes it chokes on to stderr itself.
    return subprocess.run([sys.executable, "-m", "sdqes_edge.cli", *args], capture_output=True, text=True,
                          errors="replace", **popen)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A small synthetic corpus in the layout `synth` writes: videos/*.avi and annotations.csv."""
    out = tmp_path_factory.mktemp("corpus")
    write_dataset(out, {"test": list(range(STREAMS))}, seconds=20.0, fps=2.0)
    return out


@pytest.fixture(scope="module")
def per_stream_traces(corpus, tmp_path_factory) -> Path:
    """The reference: `sdqes-edge run --scores` once per video with that video's queries, one thread."""
    out = tmp_path_factory.mktemp("per-stream")
    for uid, group in by_video(load_annotations(str(corpus / "annotations.csv"))).items():
        queries = [arg for a in group for arg in ("--query", a.query, "--message", a.response)]
        done = cli("run", str(DEMO_BUNDLE), "--source", str(corpus / "videos" / f"{uid}.avi"), *queries,
                   "--scores", str(out / f"{uid}.npz"), "--threads", "1", "--quiet")
        assert done.returncode == 0, done.stderr
    return out


def score(corpus: Path, out: Path, *extra: str, videos: Path | None = None, **popen):
    return cli("score", str(DEMO_BUNDLE), "--annotations", str(corpus / "annotations.csv"), "--videos",
               str(videos or corpus / "videos"), "--out", str(out), "--quiet", *extra, **popen)


def assert_same_traces(reference: Path, scored: Path, streams: list[str]) -> None:
    for stream in streams:
        want, got = load_scores(reference / f"{stream}.npz"), load_scores(scored / "traces" / f"{stream}.npz")
        assert (got.stream, got.fps, got.query_texts, got.query_ids) == (want.stream, want.fps, want.query_texts,
                                                                         want.query_ids), stream
        np.testing.assert_array_equal(got.asked_time, want.asked_time)
        np.testing.assert_array_equal(got.probs, want.probs, err_msg=stream)


def uids(corpus: Path) -> list[str]:
    return sorted(p.stem for p in (corpus / "videos").glob("*.avi"))


def test_the_local_pool_gives_the_traces_and_report_of_running_each_stream(corpus, per_stream_traces, tmp_path):
    done = score(corpus, tmp_path / "pool", "--workers", "2", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert_same_traces(per_stream_traces, tmp_path / "pool", uids(corpus))
    evaluated = cli("eval", "--annotations", str(corpus / "annotations.csv"), "--split", "", "--scores",
                    str(per_stream_traces), "--threshold", str(json.loads((DEMO_BUNDLE / "manifest.json")
                                                                          .read_text())["thresholds"]["default"]),
                    "--out", str(tmp_path / "eval"), "--plots", "0")
    assert evaluated.returncode == 0, evaluated.stderr
    by_path = list(json.loads((tmp_path / "eval" / "eval.json").read_text())["results"].values())[0]
    by_score = list(json.loads((tmp_path / "pool" / "eval.json").read_text())["results"].values())[0]
    assert by_score["queries"] == by_path["queries"] == 5 * STREAMS
    assert (by_score["recall"], by_score["min_distance"]) == (by_path["recall"], by_path["min_distance"])
    # The eval command printed next, as given (eval's own default split, 'val', held none of these streams).
    suggested = shlex.split(done.stdout.splitlines()[-1].removeprefix("next: ").split(" (")[0])
    assert suggested[:2] == ["sdqes-edge", "eval"]
    assert cli(*suggested[1:], "--out", str(tmp_path / "next"), "--plots", "0").returncode == 0


def test_no_more_workers_start_than_cores_or_streams_and_a_thread_count_is_brought_down_once(corpus, tmp_path):
    """64 workers on 2 cores loaded 64 bundles (600 MB each at ViT-B/16) to take turns on the cores, and a
    --threads above the cores was warned about by every worker, once per session it made."""
    from sdqes_edge.runtime.cores import usable_cores

    cores = usable_cores()
    done = score(corpus, tmp_path / "many", "--workers", "64", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert f"with {min(cores, STREAMS)} worker process(es) x 1 ONNX Runtime thread(s)" in done.stderr
    assert (f"--workers 64 on {cores} usable core(s)" in done.stderr) == (cores < 64)
    done = score(corpus, tmp_path / "threads", "--workers", "1", "--threads", "999")
    assert done.returncode == 0 and done.stderr.count("999 threads asked of ONNX Runtime") == 1, done.stderr
    assert "sdqes-edge: warning: 999 threads asked of ONNX Runtime" in done.stderr  # the command line's own form


def test_ray_gives_the_same_traces_as_running_each_stream(corpus, per_stream_traces, tmp_path):
    pytest.importorskip("ray", reason="Ray is the optional extra sdqes-edge[ray] (scripts/setup.sh --dev has it)")
    killed_actors_copy = orphaned_scratch(BUNDLE_COPY_PREFIX)
    done = score(corpus, tmp_path / "ray", "--ray", "--threads", "1")
    assert done.returncode == 0, done.stderr
    assert_same_traces(per_stream_traces, tmp_path / "ray", uids(corpus))
    assert not killed_actors_copy.exists()


# --- scratch folders of killed scorers ---------------------------------------------------------------------

def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def orphaned_scratch(prefix: str) -> Path:
    """What a killed scorer of this host leaves in the temp folder: a scratch folder with its files."""
    folder = Path(tempfile.gettempdir()) / f"{prefix}{socket.gethostname()}-{dead_pid()}-orphan"
    folder.mkdir()
    (folder / "step.fp32.onnx").write_bytes(b"a bundle copy, or a stream's trace chunks")
    return folder


def test_scratch_folders_are_removed_once_their_process_is_gone_and_only_those_of_this_host(tmp_path, monkeypatch):
    """A Ray actor ended with an interrupted run, or a worker the pool terminated, runs no cleanup: each such run
    left a whole bundle copy per actor, or a stream's trace chunks, in the temp folder for good."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(socket, "gethostname", lambda: "jetson-orin-01")
    gone, running = dead_pid(), os.getppid()
    folders = {name: tmp_path / name for name in (f"sdqes-score-jetson-orin-01-{gone}-x1", f"sdqes-score-jetson-orin"
                                                  f"-01-{running}-x2", f"sdqes-score-other-node-{gone}-x3",
                                                  "sdqes-score-notes", f"sdqes-ray-bundle-jetson-orin-01-{gone}-x4")}
    for folder in folders.values():
        folder.mkdir()
    made = scratch_directory(SCRATCH_PREFIX)
    assert made.parent == tmp_path and made.name.startswith(f"sdqes-score-jetson-orin-01-{os.getpid()}-")
    kept = sorted(p.name for p in tmp_path.iterdir() if p != made)
    assert kept == sorted(set(folders) - {f"sdqes-score-jetson-orin-01-{gone}-x1"})


def test_the_next_scoring_run_removes_what_a_killed_one_left(corpus, tmp_path):
    killed_workers_chunks = orphaned_scratch(SCRATCH_PREFIX)
    done = score(corpus, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert not killed_workers_chunks.exists()


def test_a_corrupt_and_a_missing_video_are_named_and_the_rest_is_scored(corpus, per_stream_traces, tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    good, corrupt, missing, *rest = uids(corpus)
    for uid in [good, *rest]:
        (videos / f"{uid}.avi").write_bytes((corpus / "videos" / f"{uid}.avi").read_bytes())
    (videos / f"{corrupt}.avi").write_bytes((corpus / "videos" / f"{corrupt}.avi").read_bytes()[:4000])
    done = score(corpus, tmp_path / "out", "--workers", "2", "--threads", "1", videos=videos)
    assert done.returncode == 1
    failures = {f["stream"]: f["error"] for f in json.loads((tmp_path / "out" / "failures.json").read_text())}
    assert set(failures) == {corrupt, missing}
    assert "cannot decode" in failures[corrupt] and "no video named" in failures[missing]
    assert f"failed: {corrupt}" in done.stderr and "Traceback" not in done.stderr
    # a missing video is one warning for all of them, before any worker starts (a line each was hundreds)
    assert f"warning: 1 of the {len(uids(corpus))} annotated videos to score are not in {videos} (e.g. {missing}.*)" \
        in done.stderr and f"failed: {missing}" not in done.stderr
    assert_same_traces(per_stream_traces, tmp_path / "out", [good, *rest])


def test_a_stream_named_with_a_terminals_control_characters_is_shown_not_obeyed(corpus, tmp_path):
    """The annotations are someone else's data: a video uid holding "\x1b[2J" cleared the terminal as its failure
    was told."""
    first = uids(corpus)[0]
    annotations = tmp_path / "annotations.csv"
    annotations.write_text((corpus / "annotations.csv").read_text().replace(first, "\x1b[2Jkitchen"))
    done = cli("score", str(DEMO_BUNDLE), "--annotations", str(annotations), "--videos", str(corpus / "videos"),
               "--out", str(tmp_path / "\x1b]0;title\x07out"), "--quiet", "--workers", "1")
    assert done.returncode == 1 and "(e.g. \\x1b[2Jkitchen.*)" in done.stderr, done.stderr
    assert "\\x1b]0;title\\x07out" in done.stderr + done.stdout
    assert not any(control in done.stderr + done.stdout for control in "\x1b\x07"), done.stderr


def test_a_clip_of_a_video_is_never_streamed_as_the_video_and_its_failure_names_it(corpus, tmp_path):
    """EgoSDQES times events from the start of the whole video; a clip starts part-way into it. A folder of clip
    files was streamed as the videos (found by clip_uid), every event start off by the clip's offset, silently."""
    from sdqes_edge.corpus import plan_streams

    first, second = uids(corpus)[:2]
    annotations = tmp_path / "annotations.csv"
    annotations.write_text((corpus / "annotations.csv").read_text().replace(f"{first},{first},", f"{first},clip-a,"))
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "clip-a.avi").write_bytes((corpus / "videos" / f"{first}.avi").read_bytes())
    # and one whole video, so the folder is not refused as holding none of them (test_corpus_video_folder.py)
    shutil.copy(corpus / "videos" / f"{second}.avi", tmp_path / "clips")
    task = next(t for t in plan_streams(load_annotations(str(annotations)), tmp_path / "clips") if t.stream == first)
    assert task.video is None and task.clip_only == str(tmp_path / "clips" / "clip-a.avi")
    done = cli("score", str(DEMO_BUNDLE), "--annotations", str(annotations), "--videos", str(tmp_path / "clips"),
               "--out", str(tmp_path / "out"), "--quiet", "--workers", "1")
    failures = {f["stream"]: f["error"] for f in json.loads((tmp_path / "out" / "failures.json").read_text())}
    assert done.returncode == 1 and failures[first].startswith(
        f"no video named {first}.* in the video folder, only clip-a.avi, one of its clips: the annotations time")


def test_a_video_found_twice_in_the_folder_is_streamed_from_one_copy_and_the_others_are_named(corpus, tmp_path):
    """Ego4D keeps full_scale/ and video_540ss/ copies of every video: pointed at v2/, which one was streamed went
    unsaid (and a downscaled copy scores differently)."""
    from sdqes_edge.corpus import copies_words, plan_streams

    first = uids(corpus)[0]
    for copy in ("full_scale", "video_540ss"):
        (tmp_path / copy).mkdir()
        shutil.copy(corpus / "videos" / f"{first}.avi", tmp_path / copy / f"{first}.avi")
    tasks = plan_streams(load_annotations(str(corpus / "annotations.csv")), tmp_path)
    task = next(t for t in tasks if t.stream == first)
    assert task.video == str(tmp_path / "full_scale" / f"{first}.avi")
    assert task.also == (str(tmp_path / "video_540ss" / f"{first}.avi"),)
    assert copies_words(tasks).startswith(f"1 annotated video(s) have more than one file in the video folder (e.g. "
                                          f"{first}: {task.video}, also {task.also[0]})")
    assert copies_words(plan_streams(load_annotations(str(corpus / "annotations.csv")), corpus / "videos")) is None


def test_an_interrupted_run_resumes_and_a_half_written_trace_never_counts(corpus, per_stream_traces, tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "sdqes_edge.cli", "score", str(DEMO_BUNDLE), "--annotations",
                                str(corpus / "annotations.csv"), "--videos", str(corpus / "videos"), "--out", str(out),
                                "--workers", "1", "--threads", "1", "--quiet"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((out / "traces").glob("*.npz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    kept = sorted(p.stem for p in (out / "traces").glob("*.npz"))
    assert kept and process.returncode in (0, 143), stderr
    # A trace cut off mid-write (or damaged) is scored again; a temporary file is no trace.
    (out / "traces" / f"{kept[0]}.npz").write_bytes(b"PK\x03\x04 cut off")
    (out / "traces" / ".synthetic-999999.npz.partial-12345").write_bytes(b"half")  # a killed writer's
    again = score(corpus, out, "--workers", "1", "--threads", "1")
    assert again.returncode == 0, again.stderr
    assert f"{len(kept) - 1} already scored" in again.stderr
    assert_same_traces(per_stream_traces, out, uids(corpus))


def test_a_second_run_into_the_same_out_is_refused_while_the_first_scores(corpus, tmp_path):
    """Both scored every stream the first had not finished, writing the same traces and report in turn."""
    out = tmp_path / "out"
    with another_run_writing(out, "scored_by.json") as first:  # as a scoring run holds its --out
        second = score(corpus, out, "--workers", "1")
    assert second.returncode == 2 and second.stderr.strip() == (
        f"sdqes-edge: error: --out {out} is being written by another run (pid {first.pid}, sdqes-edge); stop that "
        "run, or give this one another folder")
    assert not (out / "traces").exists()
    assert score(corpus, out, "--workers", "1").returncode == 0  # the first gone, its lock stops no one


def test_a_re_run_with_another_model_or_frame_rate_is_refused_rather_than_mixing_two_models_traces(corpus, tmp_path):
    import shutil

    out = tmp_path / "out"
    first = score(corpus, out, "--workers", "1", "--threads", "1")
    assert first.returncode == 0, first.stderr
    other = tmp_path / "demo-at-1fps"  # the same graphs streamed at another rate: every trace would differ
    shutil.copytree(DEMO_BUNDLE, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["fps"] = 1.0 if manifest["fps"] != 1.0 else 2.0
    (other / "manifest.json").write_text(json.dumps(manifest))
    again = cli("score", str(other), "--annotations", str(corpus / "annotations.csv"), "--videos",
                str(corpus / "videos"), "--out", str(out), "--quiet")
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert "holds traces scored by another model, frame rate, precision or device" in again.stderr
    assert "give a new --out" in again.stderr


def test_an_output_folder_is_tied_to_the_model_that_scored_it_first(tmp_path):
    from sdqes_edge.corpus import SCORED_BY_NAME, claim_output
    from sdqes_edge.errors import UserError

    claim_output(tmp_path / "out", "a" * 64, 2.0)
    claim_output(tmp_path / "out", "a" * 64, 2.0)  # the same model again: a resumed run
    with pytest.raises(UserError, match="scored by another model"):
        claim_output(tmp_path / "out", "b" * 64, 2.0)
    (tmp_path / "out" / SCORED_BY_NAME).write_text("{")  # damaged: nothing says which model it was
    with pytest.raises(UserError, match="scored by another model"):
        claim_output(tmp_path / "out", "a" * 64, 2.0)

def test_ray_without_ray_installed_says_how_to_install_it(corpus, tmp_path):
    code = "import sys; sys.modules['ray'] = None\nfrom sdqes_edge.cli import run\nsys.exit(run(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "score", str(DEMO_BUNDLE), "--annotations",
                           str(corpus / "annotations.csv"), "--videos", str(corpus / "videos"), "--out",
                           str(tmp_path / "out"), "--ray"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "sdqes-edge: error: --ray needs Ray: pip install 'sdqes-edge[ray]'"


def test_a_video_folder_that_does_not_exist_is_one_line(corpus, tmp_path):
    done = score(corpus, tmp_path / "out", videos=tmp_path / "nowhere")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "does not exist" in done.stderr


def test_a_file_given_as_the_video_folder_is_named_a_file(corpus, tmp_path):
    # It was reported as a folder that "does not exist", which the user can see it does.
    done = score(corpus, tmp_path / "out", videos=corpus / "annotations.csv")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "annotations.csv is a file, not a folder; give the folder that holds the annotated videos" in done.stderr



STOP_POOL_ON_FIRST_OUTCOME = """
import sys
from pathlib import Path
from sdqes_edge.corpus import StreamTask, score_in_pool

bundle, finite, endless = sys.argv[1:]
def stop(outcome):  # what Ctrl-C or SIGTERM does in the driver while a worker still holds a stream
    print("first outcome", outcome.stream, outcome.error, flush=True)
    raise KeyboardInterrupt
tasks = [StreamTask("endless", endless, (("a query", "an alert"),)),
         StreamTask("finite", finite, (("a query", "an alert"),))]
try:
    score_in_pool(tasks, Path(bundle), workers=2, threads=1, report=stop)
except KeyboardInterrupt:
    print("stopped", flush=True)
"""


def test_a_stopped_pool_does_not_wait_for_the_streams_its_workers_hold(corpus, endless_stream):
    finite = corpus / "videos" / f"{uids(corpus)[0]}.avi"
    process = subprocess.Popen([sys.executable, "-c", STOP_POOL_ON_FIRST_OUTCOME, str(DEMO_BUNDLE), str(finite),
                                endless_stream], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its own process group, workers included: see finally
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        stdout, stderr = "", "the stopped pool waited for the worker that holds the endless stream"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert stdout.splitlines() == ["first outcome finite None", "stopped"], stderr


STOP_RAY_MID_STREAM = """
import sys
from pathlib import Path
from sdqes_edge.corpus import StreamTask
from sdqes_edge.corpus_ray import score_on_ray
from sdqes_edge.stopping import exit_code_of, raise_on_termination

bundle, finite, endless = sys.argv[1:]
raise_on_termination()  # as the command line does first
tasks = [StreamTask("endless", endless, (("a query", "an alert"),)),
         StreamTask("finite", finite, (("a query", "an alert"),))]
try:
    score_on_ray(tasks, Path(bundle), threads=1, report=lambda o: print("outcome", o.stream, o.error, flush=True),
                 actors=2, init_args={"num_cpus": 2})  # both streams at once, whatever the machine's cores
except KeyboardInterrupt as interrupt:
    print("stopped with exit status", exit_code_of(interrupt), flush=True)
"""


def test_sigterm_stops_a_ray_run_as_it_stops_any_other(corpus, endless_stream):
    # Ray's init takes SIGTERM over (a stack dump, exit 1) and its wait re-raises a stop as a plain
    # KeyboardInterrupt: the run must still unwind, say so, and exit 143 as systemd and docker expect.
    pytest.importorskip("ray", reason="Ray is the optional extra sdqes-edge[ray] (scripts/setup.sh --dev has it)")
    finite = corpus / "videos" / f"{uids(corpus)[0]}.avi"
    process = subprocess.Popen([sys.executable, "-c", STOP_RAY_MID_STREAM, str(DEMO_BUNDLE), str(finite),
                                endless_stream], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        if select.select([process.stdout], [], [], 120)[0]:  # a hang guard, not a timing
            first = process.stdout.readline()  # the finite stream is done; the driver waits on the endless one
        else:
            first = "no outcome within 120 s"
        process.send_signal(signal.SIGTERM)
        rest, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert first.strip() == "outcome finite None", stderr
    assert rest.splitlines() == ["stopped with exit status 143"], stderr
    assert "SIGTERM received" not in stderr
