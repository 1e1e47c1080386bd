"""sdqes_edge.runtime: the torch-free side that runs on the robot or headset.

numpy, OpenCV and ONNX Runtime (or TensorRT + pycuda) only; a test runs it in an
interpreter where torch cannot be imported. The pieces, in the order a frame
meets them: ``sources`` (OpenCV capture sampled at the bundle's fps) ->
``preprocess`` -> a backend (``onnxruntime_backend`` with ``bound_step`` on a GPU, ``tensorrt_backend``)
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

from sdqes_edge.state import STATE_INPUT_PREFIX, STATE_OUTPUT_PREFIX, StateSpec, StateTensorSpec
from sdqes_edge.tokenizer import ClipTokenizer, default_tokenizer

from .alerts import AlertPolicy
from .backend import StepBackend, StepResult
from .bundle import Bundle, BundleError, load_bundle
from .detector import StreamingDetector, StreamSlot
from .pacing import FrameRateWarning
from .sinks import AlertEvent, AnnotatedVideoSink, CallbackSink, ConsoleSink, JsonlSink, ScoreTraceRecorder
from .sources import Frame, open_source

__all__ = ["STATE_INPUT_PREFIX", "STATE_OUTPUT_PREFIX", "StateSpec", "StateTensorSpec", "ClipTokenizer",
           "default_tokenizer", "AlertPolicy", "StepBackend", "StepResult", "Bundle", "BundleError", "load_bundle",
           "StreamingDetector", "StreamSlot", "FrameRateWarning",
           "AlertEvent", "AnnotatedVideoSink", "CallbackSink", "ConsoleSink", "JsonlSink", "ScoreTraceRecorder",
           "Frame", "open_source"]
