"""The model's memory kept across a restart by the native runtime: the C API's sdqes_step_save_memory and
sdqes_step_load_memory, and sdqes-run --state, which keeps it beside each stream's alert states. A stream resumed
from its memory goes on as the stream that never stopped, to within float rounding; a file of another model, a
damaged one or one that is not ours is refused in one line, and the step is left as it was."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from native_fixtures import QUERIES, STREAMS, CApi, preprocessed

FORMAT_LINE = b"sdqes model memory, version 1"


def memory_of(path: Path) -> tuple[dict, np.ndarray]:
    """A memory file's header and its state, read as an fp32 graph's floats."""
    format_line, header, state = path.read_bytes().split(b"\n", 2)
    assert format_line == FORMAT_LINE
    return json.loads(header), np.frombuffer(state, np.float32)


class MemoryApi(CApi):
    """The C API with the calls these tests repeat."""

    def save(self, step, stream: int, path: Path) -> int:
        return self.step_save_memory(step, stream, str(path).encode(), self.error, len(self.error))

    def load(self, step, stream: int, path: Path) -> int:
        return self.step_load_memory(step, stream, str(path).encode(), self.error, len(self.error))

    def open_step(self, bundle, precision: bytes | None = None):
        step = self.step_open(bundle, b"onnxruntime", precision, 1, self.error, len(self.error))
        assert step, self.said()
        return step

    def memory_after(self, bundle, frames: list, path: Path, precision: bytes | None = None,
                     resume_from: Path | None = None) -> np.ndarray:
        """A fresh step of `bundle` (given `resume_from`'s memory, if any) stepped on `frames`: its memory saved to
        `path`, and read as an fp32 graph's floats."""
        step = self.open_step(bundle, precision)
        if resume_from is not None:
            assert self.load(step, 0, resume_from) == 0, self.said()
        probabilities = np.empty(self.bundle_query_count(bundle), np.float32)
        for frame in frames:
            assert self.step_run(step, self.floats(frame), self.floats(probabilities), self.error,
                                 len(self.error)) == 0, self.said()
        assert self.save(step, 0, path) == 0, self.said()
        self.step_close(step)
        return memory_of(path)[1]

    def step_streams_on(self, step, frames: list, probabilities: np.ndarray) -> np.ndarray:
        assert self.step_run_streams(step, self.frame_pointers(frames), self.floats(probabilities), self.error,
                                     len(self.error)) == 0, self.said()
        return probabilities.copy()


@pytest.fixture(scope="module")
def api(sdqes_run_on_the_cpu) -> MemoryApi:
    return MemoryApi(sdqes_run_on_the_cpu.parent / "libsdqes.so")


@pytest.fixture(scope="module")
def sampled_images(video) -> list[np.ndarray]:
    from sdqes_edge.runtime.sources import VideoFileSource

    return [np.ascontiguousarray(frame.image) for frame in VideoFileSource(video, 5.0).sampled()]


@pytest.mark.parametrize("kind", ["plain", "fused"])
def test_a_stream_resumed_from_its_memory_goes_on_as_the_stream_that_never_stopped(api, three_camera_bundles,
                                                                                   sampled_images, kind, tmp_path):
    """Three cameras for 20 steps; camera 1's memory saved. The step that goes on gives camera 1 15 more frames. A
    step opened afresh (a restarted service) loads that memory into stream 2 (the camera now in another slot) and
    gives it the same 15 frames: its probabilities, and its memory after them, are the uninterrupted camera's.
    Without the memory they are not."""
    opened = api.bundle_open(str(three_camera_bundles[kind]).encode(), api.error, len(api.error))
    frames = preprocessed(api, opened, sampled_images)
    probabilities = np.empty((STREAMS, len(QUERIES)), np.float32)
    first = api.open_step(opened)
    for t in range(20):
        api.step_streams_on(first, [frames[t], frames[-1 - t], frames[(t + 25) % len(frames)]], probabilities)
    saved = tmp_path / "camera1.memory"
    assert api.save(first, 1, saved) == 0, api.said()
    later = range(20, 35)
    uninterrupted = [api.step_streams_on(first, [None, frames[t], None], probabilities)[1] for t in later]
    resumed_step, fresh_step = api.open_step(opened), api.open_step(opened)
    assert api.load(resumed_step, 2, saved) == 0, api.said()
    resumed = [api.step_streams_on(resumed_step, [None, None, frames[t]], probabilities)[2] for t in later]
    fresh = [api.step_streams_on(fresh_step, [None, None, frames[t]], probabilities)[2] for t in later]
    worst = float(np.abs(np.asarray(resumed) - np.asarray(uninterrupted)).max())
    cold = float(np.abs(np.asarray(fresh) - np.asarray(uninterrupted)).max())
    print(f"\n{kind}: resumed within {worst:.1e} of the uninterrupted stream over 15 frames; started fresh, {cold:.1e}")
    assert worst <= 1e-6 and cold > 1e-4
    for step, stream, name in ((first, 1, "uninterrupted"), (resumed_step, 2, "resumed")):
        assert api.save(step, stream, tmp_path / f"{name}.memory") == 0, api.said()
    header, state = memory_of(tmp_path / "uninterrupted.memory")
    resumed_header, resumed_state = memory_of(tmp_path / "resumed.memory")
    assert resumed_header == header and header["bytes"] == state.nbytes > 0
    assert [t["name"] for t in header["tensors"]] == [t["name"] for t in
                                                      json.loads((three_camera_bundles[kind] / "manifest.json")
                                                                 .read_text())["state"]]
    np.testing.assert_allclose(resumed_state, state, rtol=0, atol=1e-6)  # the next state too, every tensor
    for step in (first, resumed_step, fresh_step):
        api.step_close(step)
    api.bundle_close(opened)


def test_a_memory_file_that_cannot_be_loaded_is_refused_in_one_line_and_the_step_is_left_as_it_was(
        api, three_camera_bundles, sampled_images, tmp_path):
    plain = api.bundle_open(str(three_camera_bundles["plain"]).encode(), api.error, len(api.error))
    fused = api.bundle_open(str(three_camera_bundles["fused"]).encode(), api.error, len(api.error))
    frames = preprocessed(api, plain, sampled_images[:6])
    probabilities = np.empty((STREAMS, len(QUERIES)), np.float32)
    fused_step = api.open_step(fused)
    api.step_streams_on(fused_step, frames[:STREAMS], probabilities)
    assert api.save(fused_step, 0, tmp_path / "fused.memory") == 0, api.said()
    good = tmp_path / "fused.memory"
    plain_step = api.open_step(plain)
    assert api.save(plain_step, 0, tmp_path / "plain.memory") == 0, api.said()
    cut = tmp_path / "cut.memory"
    cut.write_bytes((tmp_path / "plain.memory").read_bytes()[:-10])
    (tmp_path / "notes.txt").write_text("not a memory\n")
    (tmp_path / "bad-header.memory").write_bytes(FORMAT_LINE + b"\n{\n")
    step, twin = api.open_step(plain), api.open_step(plain)
    for stream, path, said in (
            (0, good, f"{good} holds the memory of another model (not this bundle's: another export?); remove it, "
                      "and the stream starts fresh"),
            (0, cut, f"{cut} is damaged ("),
            (0, tmp_path / "notes.txt", f"{tmp_path / 'notes.txt'} is not a model memory file"),
            (0, tmp_path / "bad-header.memory", "is damaged (its header is not JSON)"),
            (0, tmp_path / "missing.memory", "cannot be read (No such file or directory)"),
            (3, good, "stream 3 is out of range: the step graph steps 3 streams, 0 to 2")):
        assert api.load(step, stream, path) == 1
        assert said in api.said() and "\n" not in api.said(), api.said()
    np.testing.assert_array_equal(api.step_streams_on(step, frames[3:6], probabilities),
                                  api.step_streams_on(twin, frames[3:6], probabilities))  # nothing half-loaded
    assert api.save(step, 0, tmp_path / "no-such-folder" / "m.memory") == 1
    assert api.said().startswith(f"cannot write {tmp_path / 'no-such-folder' / 'm.memory'}: No such file")
    assert api.step_save_memory(None, 0, b"x", api.error, len(api.error)) == 1
    assert api.said().startswith("step is NULL; give sdqes_step_save_memory the step")
    for opened_step in (fused_step, plain_step, step, twin):
        api.step_close(opened_step)
    api.bundle_close(plain)
    api.bundle_close(fused)


def test_sdqes_run_state_keeps_the_models_memory_and_a_restart_goes_on_from_it(sdqes_run_on_the_cpu, api, bundle,
                                                                               video, sampled_images, tmp_path):
    """sdqes-run --state state.json writes state.memory beside it: after 30 frames it holds the state the C API's
    step holds after the same 30 frames. Started again, sdqes-run goes on from it, at the video's sample 30: after 5
    more frames its memory is that of a step that loaded it and stepped samples 30 to 34, not that of a fresh step.
    A damaged memory file is set aside with a warning and the model starts fresh (the video still going on)."""
    state = tmp_path / "state.json"

    def sdqes_run(frames: int) -> str:
        done = subprocess.run([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--state", str(state),
                               "--max-frames", str(frames), "--threshold", "0.73"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr

    opened = api.bundle_open(bundle.encode(), api.error, len(api.error))
    frames = preprocessed(api, opened, sampled_images)

    def c_api_memory(name: str, samples: slice, resume_from: Path | None = None) -> np.ndarray:
        return api.memory_after(opened, frames[samples], tmp_path / name, resume_from=resume_from)

    said = sdqes_run(30)
    assert "resumed the model's memory" not in said
    memory = tmp_path / "state.memory"
    np.testing.assert_allclose(memory_of(memory)[1], c_api_memory("thirty.memory", slice(0, 30)), rtol=0,
                               atol=1e-6)
    said = sdqes_run(5)
    assert f"sdqes-run: resumed the model's memory from {memory}" in said and "goes on at 6 s" in said
    resumed = memory_of(memory)[1]
    np.testing.assert_allclose(resumed, c_api_memory("resumed.memory", slice(30, 35), tmp_path / "thirty.memory"),
                               rtol=0, atol=1e-6)
    assert np.abs(resumed - c_api_memory("fresh.memory", slice(30, 35))).max() > 1e-4
    memory.write_bytes(memory.read_bytes()[:-4])
    said = sdqes_run(1)
    kept = [line for line in said.splitlines() if "warning: --state memory" in line]
    assert len(kept) == 1 and f"{memory} is damaged (" in kept[0], said
    assert ": the model starts fresh; that file is kept as " in kept[0]
    assert len(list(tmp_path.glob("state.unusable-*.memory"))) == 1
    np.testing.assert_allclose(memory_of(memory)[1], c_api_memory("one.memory", slice(35, 36)), rtol=0, atol=1e-6)
    api.bundle_close(opened)


@pytest.fixture(scope="module")
def two_precision_bundle(tmp_path_factory) -> str:
    """`bundle`'s tiny QRNN model with its fp16 step graph beside the fp32 one."""
    from conftest import random_model

    from sdqes_edge.export import ExportOptions, export_bundle

    root = tmp_path_factory.mktemp("two-precisions") / "qrnn"
    export_bundle(random_model("qrnn"), root, ExportOptions(show_progress=False, fps=5.0, verify_frames=16,
                                                            precisions=("fp32", "fp16"), drift_frames=16,
                                                            queries=QUERIES), log=lambda m: None)
    return str(root)


def test_memory_kept_by_the_fp16_graph_goes_on_in_the_fp32_one_converted(sdqes_run_on_the_cpu, api,
                                                                         two_precision_bundle, video, sampled_images,
                                                                         tmp_path):
    """A service moved from its fp16 graph to the fp32 one (or back) keeps its memory, as `sdqes-edge run --state`
    does: sdqes-run --precision fp16 --state keeps fp16 memory; started again at fp32 it says it converted it and goes
    on as a C API fp32 step given that memory for samples 30 to 34 (within 1e-6); the converted memory is the fp32
    stream's after the same 30 frames to within fp16's rounding, nowhere near a fresh start's."""
    state, memory = tmp_path / "state.json", tmp_path / "state.memory"

    def sdqes_run(precision: str, frames: int) -> str:
        done = subprocess.run([str(sdqes_run_on_the_cpu), two_precision_bundle, "--source", video, "--precision",
                               precision, "--state", str(state), "--max-frames", str(frames), "--threshold", "0.73"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr

    opened = api.bundle_open(two_precision_bundle.encode(), api.error, len(api.error))
    frames = preprocessed(api, opened, sampled_images)

    sdqes_run("fp16", 30)
    header, half_bytes = memory.read_bytes().split(b"\n", 2)[1:]
    assert {t["element_bytes"] for t in json.loads(header)["tensors"]} == {2}
    half = np.frombuffer(half_bytes, np.float16).astype(np.float32)
    (tmp_path / "fp16.memory").write_bytes(memory.read_bytes())
    fp32_after_30 = api.memory_after(opened, frames[:30], tmp_path / "c-api.memory", b"fp32")
    rounding, fresh = np.abs(half - fp32_after_30).max(), np.abs(fp32_after_30).max()
    print(f"\nfp16 memory after 30 frames against fp32's: {rounding:.1e} (the memory's largest |x| {fresh:.2f})")
    assert rounding < 0.05 * fresh
    said = sdqes_run("fp32", 5)
    assert (f"sdqes-run: resumed the model's memory from {memory} (kept by the fp16 step graph, converted)"
            in said), said
    assert {t["element_bytes"] for t in memory_of(memory)[0]["tensors"]} == {4}
    expected = api.memory_after(opened, frames[30:35], tmp_path / "c-api.memory", b"fp32", tmp_path / "fp16.memory")
    np.testing.assert_allclose(memory_of(memory)[1], expected, rtol=0, atol=1e-6)
    said = sdqes_run("fp16", 1)  # and back: the fp32 memory converted for the fp16 graph
    assert "(kept by the fp32 step graph, converted)" in said, said
    api.bundle_close(opened)


def test_sdqes_run_state_that_cannot_be_written_is_said_once_and_the_stream_goes_on_to_its_end(sdqes_run_on_the_cpu,
                                                                                               bundle, video, tmp_path):
    """--state's files are written by a thread of their own while the stream steps on. Where they cannot be written
    (here: a folder stands where each file's partial copy goes, so every write fails), the failure is said as a
    warning naming each file, once however often it is tried again, and the stream goes on to the end of the video;
    the last writes are made, and the run says it is done; then, the files refused still, its error, exit status 1,
    as `sdqes-edge run --state` ends."""
    state = tmp_path / "state.json"
    run = subprocess.Popen([str(sdqes_run_on_the_cpu), bundle, "--source", video, "--state", str(state),
                            "--threshold", "0.0001"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name in ("state.json", "state.memory"):  # before the run has loaded its bundle, let alone alerted
        in_the_way = tmp_path / f".{name}.partial-{run.pid}"
        in_the_way.mkdir()
        (in_the_way / "kept").touch()  # not empty: the failed write's clean-up cannot remove it either
    out, said = run.communicate(timeout=300)
    assert run.returncode == 1, said
    lines = said.splitlines()
    assert sum(f"warning: cannot write --state {state}: Is a directory (the file there, if any, is unchanged); the "
               "stream goes on, and tries again every 5 s" in line for line in lines) == 1, said
    memory = tmp_path / "state.memory"
    assert sum(f"warning: cannot write {memory}: Is a directory" in line for line in lines) == 1, said
    done = next(n for n, line in enumerate(lines) if line.startswith("done: "))
    assert max(n for n, line in enumerate(lines) if "warning: cannot write" in line) < done, said
    assert lines[done].startswith("done: 75 frames, 2 alerts") and out.count("] ") == 2 and not state.exists()
    assert lines[-1] == (f"sdqes-run: error: --state {state} could not be written when the stream ended (said above), "
                         "and holds what was written last, if anything; free some space or give --state another "
                         "path, and run again")


def test_sdqes_run_state_refused_is_tried_again_as_the_stream_goes_on_and_said_once_written(sdqes_run_on_the_cpu,
                                                                                            bundle, endless_stream,
                                                                                            tmp_path):
    """A refused --state write is tried again at the next frame past the 5 s interval while the stream goes on, and
    once there is room again that is said, as `sdqes-edge run --state` says it."""
    state = tmp_path / "state.json"
    run = subprocess.Popen([str(sdqes_run_on_the_cpu), bundle, "--source", endless_stream, "--state", str(state),
                            "--threshold", "0.0001"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    in_the_way = [tmp_path / f".{name}.partial-{run.pid}" for name in ("state.json", "state.memory")]
    for folder in in_the_way:  # before the run has loaded its bundle, let alone alerted
        folder.mkdir()
        (folder / "kept").touch()
    timer = threading.Timer(120, run.kill)
    timer.start()
    said = []
    try:
        for line in run.stderr:
            said.append(line)
            if "warning: cannot write --state" in line:  # room again: the next try is written
                for folder in in_the_way:
                    shutil.rmtree(folder)
            if "is written again" in line:
                run.send_signal(signal.SIGTERM)
        status = run.wait()
    finally:
        timer.cancel()
        run.kill()
    text = "".join(said)
    assert status == 128 + signal.SIGTERM, text
    assert text.count("warning: cannot write --state") == 1, text
    assert text.count(f"sdqes-run: note: --state {state} is written again") == 1, text
    assert json.loads(state.read_text()) and (tmp_path / "state.memory").stat().st_size > 0
