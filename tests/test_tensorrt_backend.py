"""The TensorRT backend on an NVIDIA GPU (skipped elsewhere, the reason printed): it streams what ONNX Runtime
streams, with the state carried on the device, and steps from any thread as from the one that made it."""

from __future__ import annotations

import numpy as np
import pytest

from sdqes_edge.errors import UserError
from sdqes_edge.runtime.preprocess import Preprocessor
from sdqes_edge.runtime.tensorrt_backend import tensorrt_ready
from sdqes_edge.sample import sample_frames


@pytest.mark.skipif(not tensorrt_ready(), reason="needs an NVIDIA GPU with TensorRT and pycuda installed")
def test_the_tensorrt_backend_streams_what_onnx_runtime_streams(exported, tmp_path):
    import shutil

    from sdqes_edge.export.tensorrt_engine import build_engine
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep
    from sdqes_edge.runtime.tensorrt_backend import TensorRTStep

    model, bundle = exported
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    build_engine(copy, precision="fp32")
    loaded = load_bundle(copy)
    trt_step, ort_step = TensorRTStep.from_bundle(loaded, "fp32"), OnnxRuntimeStep(loaded.step_graph())
    cfg = model.cfg
    pre = Preprocessor.from_config(cfg)
    trt_state, ort_state = trt_step.initial_state(), ort_step.initial_state()
    first = trt_state
    for frame in pre.batch(sample_frames(32, 120, 160)):
        a, b = trt_step.step(frame[None], trt_state), ort_step.step(frame[None], ort_state)
        assert np.abs(a.embedding - b.embedding).max() <= 1e-3  # TensorRT may pick TF32 kernels
        trt_state, ort_state = a.state, b.state
    final = trt_step.state_to_numpy(trt_state)
    for name, value in ort_state.items():
        assert np.abs(final[name] - value).max() <= 1e-2 * max(1.0, np.abs(value).max())
    with pytest.raises(UserError, match="stale"):  # its buffer set has been written since, as on ORT's bound path
        trt_step.step(frame[None], first)


@pytest.mark.skipif(not tensorrt_ready(), reason="needs an NVIDIA GPU with TensorRT and pycuda installed")
def test_a_tensorrt_backend_steps_from_any_thread_as_from_the_one_that_made_it(exported, tmp_path):
    """pycuda makes its context current on the thread that created it alone: a step from a ROS 2 executor's thread
    ran against no context, or CUDA's primary one, where the backend's buffers are not."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from sdqes_edge.export.tensorrt_engine import build_engine
    from sdqes_edge.runtime.bundle import load_bundle
    from sdqes_edge.runtime.tensorrt_backend import TensorRTStep

    model, bundle = exported
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    build_engine(copy, precision="fp32")
    here, elsewhere = (TensorRTStep.from_bundle(load_bundle(copy), "fp32") for _ in range(2))
    frames = Preprocessor.from_config(model.cfg).batch(sample_frames(12, 120, 160))
    with ThreadPoolExecutor(2) as threads:  # each call on whichever of two threads takes it, none on this one
        state, other = here.initial_state(), threads.submit(elsewhere.initial_state).result()
        for frame in frames:
            a, b = here.step(frame[None], state), threads.submit(elsewhere.step, frame[None], other).result()
            np.testing.assert_array_equal(b.embedding, a.embedding)
            state, other = a.state, b.state
        ends = here.state_to_numpy(state), threads.submit(elsewhere.state_to_numpy, other).result()
    for name, value in ends[0].items():
        np.testing.assert_array_equal(ends[1][name], value)
