"""sdqes_edge.runtime: the torch-free side that runs on the robot or headset.

numpy, OpenCV and ONNX Runtime (or TensorRT + pycuda) only; a test runs it in an
interpreter where torch cannot be imported. The pieces, in the order a frame
meets them: ``sources`` (OpenCV capture sampled at the bundle's fps) ->
``preprocess`` -> a backend (``onnxruntime_backend`` on a session ``ort_sessions`` makes, with ``bound_step`` on a
GPU; ``tensorrt_backend``)
stepping the graph with the state carried by name -> ``queries`` (one product
for all queries) -> ``alerts`` (policy per query) -> ``sinks``. ``detector``
ties them together; ``bundle`` reads what the exporter wrote.

    from sdqes_edge.runtime import StreamingDetector, open_source
    detector = StreamingDetector("bundles/qrnn")
    detector.add_query("When I start cooking, remind me to wash my hands.", "Wash your hands!")
    for alerts in detector.run(open_source("kitchen.mp4", detector.fps)):
        for alert in alerts:
            print(alert.stream_time, alert.message)
"""

from __future__ import annotations

import importlib

# Each public name and the module that defines it. They load on first use (PEP 562), not with the package, so that
# importing one cv2-free module of the runtime (its backends, read by the command line's --help) needs no OpenCV.
_EXPORTS = {
    "sdqes_edge.state": ("STATE_INPUT_PREFIX", "STATE_OUTPUT_PREFIX", "StateSpec", "StateTensorSpec"),
    "sdqes_edge.tokenizer": ("ClipTokenizer", "default_tokenizer"),
    "sdqes_edge.errors": ("SetupWarning",),
    ".alerts": ("AlertPolicy",),
    ".backend": ("StepBackend", "StepResult"),
    ".bundle": ("Bundle", "BundleError", "load_bundle"),
    ".detector": ("StreamingDetector",),
    ".stream_slot": ("StateCarriedWarning", "StreamSlot"),
    ".fused_ops": ("MissingKernelsWarning",),
    ".onnxruntime_backend": ("SlowPrecisionWarning",),
    ".pacing": ("FrameRateWarning",),
    ".queries": ("DuplicateQueryWarning", "ThresholdOutOfReachWarning", "text_encoder_for"),
    ".run_stats": ("RunStats",),
    ".annotated_video": ("AnnotatedVideoSink",),
    ".alert_log": ("JsonlSink",),
    ".sinks": ("AlertEvent", "CallbackSink", "ConsoleSink", "ScoreTraceRecorder", "Sink"),
    ".sources": ("Frame", "open_source"),
    ".source_opening": ("open_sources",),
    ".live_source": ("Cameras", "LiveSource"),
    ".step_backends": ("make_backend",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # a name once loaded is in both
