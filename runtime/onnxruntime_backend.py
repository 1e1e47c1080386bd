"""Stepping a single-step graph with ONNX Runtime, the state carried by name.

The graph's own metadata (``metadata_props["sdqes_edge"]``) says what its
state is, so a bare .onnx is enough: the initial state comes from the spec
the graph carries, never from guesses about its inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..state import StateSpec

METADATA_KEY = "sdqes_edge"  # the one key a graph's description lives under (export/graphs.py writes it)

State = dict[str, np.ndarray]  # state tensor name (as in the spec, no prefix) -> array


@dataclass
class StepResult:
    embedding: np.ndarray  # [B, E], L2-normalized
    state: State  # the next state, by name
    logits: np.ndarray | None = None  # [B, Q] when query scoring is fused into the graph


# Execution providers per device, best first; ONNX Runtime falls back along the list.
DEVICE_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


class OnnxRuntimeStep:
    """One step graph in an ``onnxruntime.InferenceSession``.

    On a GPU (``device`` "cuda" or "tensorrt") the state stays on the device between frames through
    I/O binding: only the frame goes in and the embedding comes out. ``io_binding`` forces that path
    on or off (it also runs on the CPU, which is how it is tested without a GPU).
    """

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None,
                 io_binding: bool | None = None):
        import onnxruntime as ort

        if device not in DEVICE_PROVIDERS:
            raise UserError(f"ONNX Runtime device {device!r} is not one of {', '.join(DEVICE_PROVIDERS)}")
        wanted = DEVICE_PROVIDERS[device][0]
        if wanted not in ort.get_available_providers():
            raise UserError(f"this onnxruntime has no {wanted} (it has {', '.join(ort.get_available_providers())}); "
                            "install onnxruntime-gpu on an NVIDIA machine, or use --ort-device cpu")
        self.io_binding = device != "cpu" if io_binding is None else io_binding
        self._ort_device = "cpu" if device == "cpu" else "cuda"
        self._ort = ort
        path = Path(path)
        if not path.is_file():
            raise UserError(f"step graph {path} does not exist; export a bundle with `sdqes-edge export`")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3  # ORT's warnings are about graph rewrites, not the user's input
        try:
            self.session = ort.InferenceSession(str(path), options, providers=DEVICE_PROVIDERS[device])
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise UserError(f"ONNX Runtime cannot load {path} ({str(exc).splitlines()[0]}); "
                            "the file is damaged or not a step graph: re-export it") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        if METADATA_KEY not in meta:
            raise UserError(f"{path} carries no {METADATA_KEY!r} description, so it was not made by "
                            "`sdqes-edge export`; re-export it")
        self.description: dict[str, Any] = json.loads(meta[METADATA_KEY])
        self.spec = StateSpec.from_list(self.description["state"])
        self.path = path
        self._output_names = [o.name for o in self.session.get_outputs()]
        self._input_names = {i.name for i in self.session.get_inputs()}
        missing = [t.input_name for t in self.spec if t.input_name not in self._input_names]
        missing += [t.output_name for t in self.spec if t.output_name not in self._output_names]
        if missing:
            raise UserError(f"{path} lacks state tensors its description lists ({', '.join(missing[:3])}); re-export it")

    @property
    def fused_queries(self) -> bool:
        return "query_embeddings" in self._input_names

    def initial_state(self):
        return self.state_from_numpy(dict(zip(self.spec.names, self.spec.initial_numpy())))

    # State operations every backend provides, so the detector never reaches into a backend's state
    # (with I/O binding it is a dict of OrtValues on the device; the TensorRT backend has its own).
    def state_to_numpy(self, state) -> State:
        return {name: (value.numpy() if self.io_binding else np.array(value, copy=True))
                for name, value in state.items()}

    def state_from_numpy(self, arrays: State):
        host = {t.name: np.ascontiguousarray(arrays[t.name], dtype=t.dtype) for t in self.spec}
        if not self.io_binding:
            return host
        return {name: self._ort.OrtValue.ortvalue_from_numpy(value, self._ort_device, 0)
                for name, value in host.items()}

    def keep_streams(self, new, old, streams: list[int]):
        """``new`` with the rows (streams) in ``streams`` taken from ``old``: an idle stream keeps its state."""
        if not self.io_binding:  # host arrays this backend owns: copy the rows in place
            for name in new:
                new[name][streams] = old[name][streams]
            return new
        new_host, old_host = self.state_to_numpy(new), self.state_to_numpy(old)
        for name in new_host:
            new_host[name][streams] = old_host[name][streams]
        return self.state_from_numpy(new_host)

    def reset_streams(self, state, streams: list[int] | None = None):
        initial = self.initial_state()
        if streams is None:
            return initial
        return self.keep_streams(state, initial, streams)

    def step(self, frame: np.ndarray, state: State, query_embeddings: np.ndarray | None = None) -> StepResult:
        """frame [B, 3, R, R] float32 (normalized) -> embedding, next state (and logits if fused)."""
        feeds = {"frame": np.ascontiguousarray(frame, dtype=np.float32)}
        for t in self.spec:
            feeds[t.input_name] = state[t.name]
        if self.fused_queries:
            if query_embeddings is None:
                raise UserError(f"{self.path.name} scores queries inside the graph: pass query_embeddings "
                                f"[{self.description['query_count']}, {self.description['embed_dim']}]")
            feeds["query_embeddings"] = np.ascontiguousarray(query_embeddings, dtype=np.float32)
        if self.io_binding:
            return self._step_bound(feeds, state)
        outputs = dict(zip(self._output_names, self.session.run(self._output_names, feeds)))
        next_state = {t.name: outputs[t.output_name] for t in self.spec}
        return StepResult(outputs["embedding"], next_state, outputs.get("logits"))

    def _step_bound(self, feeds: dict, state) -> StepResult:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            if name.startswith("state_in."):
                binding.bind_ortvalue_input(name, value)  # already where the last frame left it
            else:
                binding.bind_cpu_input(name, value)
        state_outputs = {t.output_name: t.name for t in self.spec}
        for name in self._output_names:
            binding.bind_output(name, self._ort_device if name in state_outputs else "cpu")
        self.session.run_with_iobinding(binding)
        outputs = dict(zip(self._output_names, binding.get_outputs()))
        next_state = {t.name: outputs[t.output_name] for t in self.spec}
        logits = outputs["logits"].numpy() if "logits" in outputs else None
        return StepResult(outputs["embedding"].numpy(), next_state, logits)
