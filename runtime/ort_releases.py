"""What differs between ONNX Runtime releases and between its providers, in one place: the release a
workaround starts or stops at, the options every CUDA session is given, and the graphs a provider runs whole."""

from __future__ import annotations

from sdqes_edge.contract import ONNX_RUNTIME_OPERATORS


def onnxruntime_release(version: str) -> tuple[int, int]:
    """'1.18.0+cu118' -> (1, 18)."""
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


# The first ONNX Runtime release whose memory plan (SessionOptions.enable_mem_pattern) keeps fp16 graphs right.
MEM_PATTERN_FIXED_IN = (1, 19)
# The first ONNX Runtime release that keeps a CUDA graph per run option ``gpu_graph_id`` (its "multiple CUDA
# graphs" work). Before it the option is ignored: a session captures one graph and replays it for every run,
# so the bound step's second binding (state set 1 -> set 0) would replay the first's (set 0 -> set 1) and the
# state would never move on, silently.
CUDA_GRAPH_IDS_SINCE = (1, 18)
# ONNX Runtime rewrites a MatMul then Add into one Gemm; on its CUDA provider that Gemm writes the bias into the
# output before multiplying onto it, slower than the Add it replaced (export/gemm_bias.py, which writes fp16
# graphs as MatMul then Add). Kept apart in CUDA sessions; the CPU's Gemm is one kernel, so CPU sessions fuse.
CUDA_DISABLED_OPTIMIZERS = ("MatMulAddFusion",)
# The first release with the CUDA provider option ``use_tf32`` (an unknown option fails the session before it).
USE_TF32_OPTION_SINCE = (1, 18)


def cuda_options(version: str) -> dict[str, str]:
    """The CUDA provider's options for every session: float32 products in float32. ONNX Runtime multiplies
    float32 in TF32 (a 10-bit mantissa) by default on Ampere and newer, and then an fp32 bundle on a GPU drifts
    from the same bundle on a CPU by 1.5e-4 in 100 frames of the tiny preset (measured, H200), where fp32 should
    be what export verified; PyTorch, likewise, keeps TF32 off for products unless asked. The fast GPU format is
    the fp16 graph, which this does not touch."""
    return {"use_tf32": "0"} if onnxruntime_release(version) >= USE_TF32_OPTION_SINCE else {}


def session_keywords(device: str) -> dict:
    """``InferenceSession``'s keyword arguments beyond providers, for a session on ``device``."""
    return {"disabled_optimizers": list(CUDA_DISABLED_OPTIMIZERS)} if device == "cuda" else {}


def fused_operators_warning(device: str, operators: str | None, graph_name: str) -> str | None:
    """Where a step graph with ONNX Runtime's fused operators (com.microsoft Attention and
    SkipLayerNormalization, the fp16 graph's default form: ``description["operators"]``) meets a provider that
    cannot run it whole, what to say; else None.

    ONNX Runtime's TensorRT provider builds TensorRT engines from what TensorRT's parser reads, and the parser
    has neither operator: ONNX Runtime hands those nodes to its CUDA provider and builds an engine for each
    piece between them (a ViT-B/16 step: three nodes a block, about 37 pieces), where the plain graph is one
    engine that fuses across blocks. It runs, but not as the one engine a TensorRT user asks for."""
    if device != "tensorrt" or operators != ONNX_RUNTIME_OPERATORS:
        return None
    return (f"{graph_name} carries ONNX Runtime's fused operators, which TensorRT lacks: ONNX Runtime's TensorRT "
            "provider runs them on its CUDA provider and the graph between them as many TensorRT engines. For one "
            "engine, re-export with --fp16-operators onnx, or build an engine with `sdqes-edge build-engine` and "
            "run it with --backend trt (it writes them back as plain ONNX)")
