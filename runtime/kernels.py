"""What one step executes: every kernel ONNX Runtime runs, counted with its own profiler.

At batch 1 a GPU step costs per kernel launched, not per FLOP (DESIGN.md, "The
step on a GPU"), so the number of kernels a step runs is the figure to watch.
ONNX Runtime's profiler (``SessionOptions.enable_profiling``) lists every kernel
of every run after the graph optimizer's fusions, on the CPU as well as on a
GPU, so the count is measurable on any machine. Views (Reshape and its kin)
are counted too but reported apart: ONNX Runtime runs them without moving data.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdqes_edge.errors import UserError
from sdqes_edge.package_builds import CUDA_PROVIDER, load_onnxruntime

from .fused_ops import FusedOps, register_fused_ops
from .ort_releases import session_keywords
from .ort_sessions import session_options

# Operators ONNX Runtime executes as a new view of the same buffer (no data moved, no device launch
# unless the output is a buffer bound by the caller).
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})

PROFILED_STEPS = 3  # steps profiled; every step runs the same kernels, and the count is per step


@dataclass(frozen=True)
class KernelCount:
    per_step: int  # kernels executed by one step
    by_op: dict[str, int]  # per step, by operator (after ONNX Runtime's fusions)
    provider: str

    @property
    def views(self) -> int:
        return sum(n for op, n in self.by_op.items() if op in VIEW_OPS)

    @property
    def computing(self) -> int:
        """Kernels that compute or move data (everything but views)."""
        return self.per_step - self.views

    def to_dict(self) -> dict:
        return {"per_step": self.per_step, "views": self.views, "computing": self.computing,
                "provider": self.provider, "by_op": dict(sorted(self.by_op.items(), key=lambda kv: -kv[1]))}


_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32}


def _zero_feeds(session) -> dict[str, np.ndarray]:
    feeds = {}
    for i in session.get_inputs():
        if any(not isinstance(d, int) for d in i.shape):
            raise UserError(f"input {i.name} has a dynamic shape {i.shape}; kernels are counted on static step graphs")
        feeds[i.name] = np.zeros(i.shape, _NUMPY_TYPES.get(i.type, np.float32))
    return feeds


def count_kernels(path: str | Path, providers: list[str] | None = None, steps: int = PROFILED_STEPS,
                  fused_ops: FusedOps | None = None) -> KernelCount:
    """Run the graph ``steps`` times (zero inputs) under ONNX Runtime's profiler and count kernels per step;
    ``fused_ops``: this project's kernel library, registered as the runtime would (runtime/fused_ops.py)."""
    ort = load_onnxruntime()
    providers = providers or ["CPUExecutionProvider"]
    with tempfile.TemporaryDirectory(prefix="sdqes-kernels-") as tmp:
        options = session_options()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "step")
        device = "cuda" if providers[0] == CUDA_PROVIDER else "cpu"  # the session the runtime would make there
        if fused_ops is not None:
            register_fused_ops(options, fused_ops, device)
        session = ort.InferenceSession(str(path), options, providers=providers, **session_keywords(device))
        feeds = _zero_feeds(session)
        for _ in range(steps):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    kernels = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    ops = Counter(e["args"]["op_name"] for e in kernels)
    total = len(kernels)
    if total % steps:
        raise RuntimeError(f"the profile of {path} lists {total} kernels over {steps} runs: not the same every run")
    return KernelCount(total // steps, {op: n // steps for op, n in ops.items()}, session.get_providers()[0])
