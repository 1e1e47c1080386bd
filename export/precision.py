"""Reduced-precision step graphs.

fp16 is traced from an fp16 copy of the model (``graphs.compute_model``): weights,
compute and the recurrent state are fp16, the frame in and the embedding out fp32.
LayerNorm's statistics and softmax's sum stay fp32 inside single fp16 nodes
(``model.layers``), so the graph has no Cast but at its two fp32 ends.

int8 is ONNX Runtime's static quantization in QDQ form (explicit
QuantizeLinear/DequantizeLinear pairs) with symmetric per-channel 7-bit weights.
Activations are per tensor, in one of two forms (``INT8_ACTIVATIONS``):
``asymmetric`` (the default: uint8 with a zero point, ONNX Runtime's own
default on the CPU) or ``symmetric`` (int8, zero point 0: the only form
TensorRT's explicit quantization accepts, so ``build-engine`` refuses the
other). The MLP's second product reads a QuickGELU output, which lies in
[-0.17, max]: symmetric int8 spends half its steps on negatives that never
come. Measured on a retrained demo model over 2,000 validation frames (min
cosine of the embedding against fp32): c_proj alone symmetric 0.793,
asymmetric 0.998; the whole tower 0.826 against 0.980. Both run as fast on
these CPUs (ViT-B/16 + QRNN, 2 cores: 2.06x against 2.07x fp32, alone).

Which products are quantized is a named policy (``INT8_POLICIES``):

- ``backbone`` (the default): only the frozen image tower's block products,
  each block's attention in/out projections and MLP (99% of a ViT-B/16 step's
  MACs), are quantized, and the first ``float_blocks`` blocks stay float
  (the exporter chooses how many with its drift check, ``AUTO_FLOAT_BLOCKS``).
  The first block's error is carried by every later block and by every
  adapter's state: on the demo model its in-projection alone costs min cosine
  0.985 and its c_fc 0.988, more than any other product, and keeping the
  block float takes the whole tower from 0.980 to 0.996 on held-out streams,
  for 1/12 of a ViT-B/16's quantized MACs (int8 over fp32 2.07x -> 1.95x,
  alone). Every adapter op, everything that reads or writes the
  recurrent state, LayerNorm, the patch embedding, the embedding projection
  and the products of two activations stay float. A recurrent state carries
  whatever error is put into it from frame to frame; quantizing the adapters'
  gates let the QRNN state of the shipped model drift to a cosine of -0.85
  against fp32 in 500 frames. The patch embedding stays float because
  quantizing it rounds the frame itself (alone it took the demo model's
  minimum cosine to 0.84); on a ViT-B/16 its product has a block's shape
  ([768, 768]), so it is recognised by where it is, the first the frame reaches.
- ``all-weights``: every product with a weight (adapters included), the
  policy before ``backbone``; kept for models without recurrent state and for
  comparison.

Weights are quantized to 7 bits (``INT8_WEIGHT_BITS``, ONNX Runtime's ``reduce_range``) under every
policy. ONNX Runtime's x86 kernels on CPUs without VNNI (AVX2, AVX-512 without VNNI) multiply the 8-bit
activations by the weights with ``vpmaddubsw``, which sums pairs of products in 16 bits and saturates when
full 8-bit weights meet large activations. Measured on an AVX2-only EPYC, tiny random models over 2,000
frames with the state carried (min cosine of the embedding against fp32): 8-bit weights 0.985 (st) and 0.994
(qrnn), with the ST state 21% off; 7-bit weights 0.99996 and 0.99994, against 0.99997 for the same graphs
with unsaturated 8-bit arithmetic (uint8 weights). Symmetric activations saturate the same way (st 0.992 ->
0.99994). 7-bit weights run on the very same kernels, so the speed on every CPU is unchanged; on a VNNI CPU
they cost one bit of weight resolution, which the figures above show is not where int8's error comes from.

Under both, a product's float output is never re-quantized
(``OpTypesToExcludeOutputQuantization``): a quantized output is one more
rounding per frame, and ONNX Runtime's CPU provider cannot fuse a Gemm whose
output is re-quantized, so it ran such Gemms in float after dequantizing their
weights on every frame (the ViT-B/16 QRNN step was 0.79x fp32's speed).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from sdqes_edge.contract import EMBEDDING_OUTPUT, FRAME_INPUT, QUERY_INPUT
from sdqes_edge.runtime.onnxruntime_backend import OnnxRuntimeStep

from .graph_edits import readers_of

WEIGHT_PRODUCT_OPS = ("MatMul", "Gemm", "Conv")
INT8_POLICIES = {
    "backbone": "the frozen image tower's block products (attention in/out projections, MLP) but the first "
                "--int8-float-blocks blocks'; adapters, state, LayerNorm, patch embedding and activation products "
                "stay float",
    "all-weights": "every product with a weight, adapters included (drifts on recurrent adapters)",
}
BACKBONE_POLICY = "backbone"  # the policy that quantizes by tower block (and so keeps leading blocks float)
DEFAULT_INT8_POLICY = BACKBONE_POLICY
# How activations are quantized: name -> what it is.
INT8_ACTIVATIONS = {
    "asymmetric": "uint8 with a zero point (ONNX Runtime's CPU default; twice the steps for a QuickGELU output)",
    "symmetric": "int8 with zero point 0, the only form TensorRT's explicit quantization builds",
}
DEFAULT_INT8_ACTIVATIONS = "asymmetric"
SYMMETRIC_ACTIVATIONS = "symmetric"
# Leading image-tower blocks whose products the backbone policy keeps float (their error reaches everything).
# The exporter's default, "auto", quantizes every block first and keeps one more leading block float each time
# the int8 graph fails its drift check, up to MAX_AUTO_FLOAT_BLOCKS: a wide tower (random ViT-B/16 + QRNN, min
# cosine 0.9999) ships every block int8, the demo model (0.980 with every block, 0.994 without the first, over
# 2,000 frames of 34 training streams) its first block float.
AUTO_FLOAT_BLOCKS = "auto"
DEFAULT_INT8_FLOAT_BLOCKS = AUTO_FLOAT_BLOCKS
MAX_AUTO_FLOAT_BLOCKS = 2
# onnxruntime.quantization.CalibrationMethod member for each name the command line takes.
CALIBRATION_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
DEFAULT_CALIBRATION_METHOD = "minmax"
# Bits of each quantized weight: 7, so that ONNX Runtime's x86 kernels without VNNI cannot saturate (see above).
INT8_WEIGHT_BITS = 7
# Measured on the demo model's QRNN with MinMax: 512 frames of training streams drift less than 64.
DEFAULT_CALIBRATION_FRAMES = 256
# A tower block's weight products in the order a block runs them, as the multiple of the width their weights
# have besides it: attention in-projection [w, 3w], out-projection [w, w], MLP c_fc [w, 4w] and c_proj [4w, w].
BLOCK_PRODUCT_WIDTHS = (3, 1, 4, 4)
BACKBONE_PRODUCTS_PER_BLOCK = len(BLOCK_PRODUCT_WIDTHS)


class QuantizationPolicyError(ValueError):
    """The graph's weight products are not the ones the policy expects (a graph not traced by this exporter)."""


@dataclass(frozen=True)
class TowerShape:
    """What the backbone policy needs to know of the image tower: its width and depth."""

    width: int
    layers: int

    @classmethod
    def from_description(cls, description: dict) -> "TowerShape":
        vision = description["model"]["vision"]
        return cls(int(vision["width"]), int(vision["layers"]))

    def is_block_weight(self, dims: list[int]) -> bool:
        """A weight shaped like one of a tower block's products: [w, 3w], [w, w], [w, 4w] or transposed."""
        w = self.width
        return len(dims) == 2 and sorted(dims) in ([w, 3 * w], [w, w], [w, 4 * w])


@dataclass(frozen=True)
class Int8Quantization:
    """How an int8 graph was made, recorded in the manifest."""

    policy: str
    calibration_method: str
    calibration_frames: int
    quantized_products: int
    float_products: int  # weight products the policy kept float
    activation_products: int  # products of two activations (always float)
    activations: str  # a key of INT8_ACTIVATIONS
    float_blocks: int  # leading tower blocks kept float (backbone policy; 0 under all-weights)
    weight_bits: int = INT8_WEIGHT_BITS  # 8 in graphs quantized before 7-bit weights (they saturate without VNNI)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        blocks = "block" if self.float_blocks == 1 else f"{self.float_blocks} blocks"
        kept_blocks = (f" ({BACKBONE_PRODUCTS_PER_BLOCK * self.float_blocks} in the first {blocks})"
                       if self.float_blocks else "")
        return (f"policy {self.policy}: {self.quantized_products} weight products int8, {self.float_products} kept "
                f"float{kept_blocks}, {self.activation_products} activation products float; {self.weight_bits}-bit "
                f"weights, {self.activations} activations, {self.calibration_method} calibration over "
                f"{self.calibration_frames} frames")


def calibration_feeds(fp32_graph: Path, frames: np.ndarray,
                      query_embeddings: np.ndarray | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The inputs the step graph sees on a real stream: each frame with the state carried to it.

    Calibrating on zero state would set the state's ranges from a stream that never started.
    Generated lazily: a ViT-B/16 RetNet state is 1.1 GiB per stream, too much to hold per frame.
    """
    runner = OnnxRuntimeStep(fp32_graph)
    state = runner.initial_state()
    for frame in frames:
        feed = {FRAME_INPUT: frame,
                **{t.input_name: state[t.name].reshape(runner.graph_shapes[t.name]) for t in runner.spec}}
        if runner.fused_queries:
            feed[QUERY_INPUT] = query_embeddings
        yield feed
        state = runner.step(frame, state, query_embeddings).state


class _FeedReader:
    """onnxruntime.quantization's CalibrationDataReader protocol over an iterator of feeds."""

    def __init__(self, feeds: Iterator[dict[str, np.ndarray]]):
        self._feeds = feeds

    def get_next(self):
        return next(self._feeds, None)


def _nearest_product(products: list, start: str, next_nodes, next_tensors) -> str | None:
    """The weight product nearest the tensor ``start``, walking the graph from it: ``next_nodes(tensor)`` gives
    the nodes one step on, ``next_tensors(node)`` the tensors beyond them (back: producers and inputs; forward:
    readers and outputs)."""
    names = {n.name for n in products}
    frontier, seen = [start], set()
    while frontier:
        for node in next_nodes(frontier.pop(0)):
            if node.name in names:
                return node.name
            if node.name not in seen:
                seen.add(node.name)
                frontier.extend(next_tensors(node))
    return None


def _tower_ends(graph, products: list, producers: dict) -> set[str]:
    """The products at the tower's two ends, no block's though either may have a block's shape: the patch
    embedding (the first the frame reaches; [3*P*P, w] is [w, w] for ViT-B/16, [4w, w] for ViT-B/32) and
    the embedding projection (the last before the ``embedding`` output; [w, E] is [w, w] where E == w)."""
    readers = readers_of(graph)
    patch_embedding = _nearest_product(products, FRAME_INPUT, lambda t: readers.get(t, []), lambda n: n.output)
    projection = _nearest_product(products, EMBEDDING_OUTPUT, lambda t: [producers[t]] if t in producers else [],
                                  lambda n: n.input)
    return {name for name in (patch_embedding, projection) if name is not None}


def select_products(graph, policy: str, tower: TowerShape | None,
                    float_blocks: int = 0) -> tuple[list[str], list[str], list[str]]:
    """(products to quantize, weight products kept float, activation products) of an ONNX graph under ``policy``.

    The blocks' products are recognised by their weights' shapes, not by node names (which depend on the
    tracer and change under ONNX Runtime's pre-processing); there must be exactly 4 per block, in a block's
    order, or the graph is not this exporter's tower. The backbone policy leaves the first ``float_blocks``
    blocks float.
    """
    from .complexity import activation_matmuls, weight_source

    if policy not in INT8_POLICIES:
        raise ValueError(f"unknown int8 policy {policy!r}; choose from {', '.join(INT8_POLICIES)}")
    activations = set(activation_matmuls(graph))
    products = [n for n in graph.graph.node if n.op_type in WEIGHT_PRODUCT_OPS and n.name not in activations]
    if policy == "all-weights":
        return [n.name for n in products], [], sorted(activations)
    if tower is None:
        raise QuantizationPolicyError("the backbone int8 policy needs the image tower's width and depth "
                                      "(the step graph's metadata carries them)")
    producers = {out: n for n in graph.graph.node for out in n.output}
    ends = _tower_ends(graph, products, producers)
    initializers = {init.name: list(init.dims) for init in graph.graph.initializer}
    weights = set(initializers)

    def weight_dims(node) -> list[int]:
        sources = (weight_source(name, weights, producers) for name in node.input[:2])
        return next((initializers[s] for s in sources if s is not None), [])

    blocks = [n for n in products if n.name not in ends and tower.is_block_weight(weight_dims(n))]
    widths = [max(weight_dims(n)) // tower.width for n in blocks]
    if widths != list(BLOCK_PRODUCT_WIDTHS) * tower.layers:
        raise QuantizationPolicyError(
            f"found {len(blocks)} weight products shaped like the image tower's blocks', expected "
            f"{BACKBONE_PRODUCTS_PER_BLOCK} per block x {tower.layers} in a block's order; an adapter may share a "
            "block's weight shape: quantize with the 'all-weights' policy instead")
    if not 0 <= float_blocks < tower.layers:
        raise QuantizationPolicyError(f"--int8-float-blocks must be from 0 to {tower.layers - 1} for this "
                                      f"{tower.layers}-block tower, not {float_blocks}")
    quantize = [n.name for n in blocks[BACKBONE_PRODUCTS_PER_BLOCK * float_blocks:]]
    chosen = set(quantize)
    kept = [n.name for n in products if n.name not in chosen]
    return quantize, kept, sorted(activations)


def _unshare_initializers(graph, chosen: set[str]) -> int:
    """Give each quantized product its own copy of any initializer another node also reads.

    The tracer stores equal constants once (every zero bias of a width, say), so a LayerNorm can read the very
    tensor a quantized Gemm takes as its bias; quantizing that bias would hand the LayerNorm a dequantized copy,
    computed every frame. Returns the number of copies made.
    """
    initializers = {init.name: init for init in graph.graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in graph.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
    copies = 0
    for node in graph.graph.node:
        if node.name not in chosen:
            continue
        for i, name in enumerate(node.input):
            if name in initializers and len(readers[name]) > 1:
                copy = graph.graph.initializer.add()
                copy.CopyFrom(initializers[name])
                copy.name = f"{name}.for.{node.name}"
                node.input[i] = copy.name
                readers[name].discard(node.name)
                copies += 1
    return copies


def quantize_int8(fp32_graph: Path, out_path: Path, calibration_frames: np.ndarray,
                  query_embeddings: np.ndarray | None = None, feeds: Iterator[dict] | None = None, *,
                  policy: str = DEFAULT_INT8_POLICY, method: str = DEFAULT_CALIBRATION_METHOD,
                  activations: str = DEFAULT_INT8_ACTIVATIONS, float_blocks: int = 0,
                  tower: TowerShape | None = None) -> Int8Quantization:
    """fp32 step graph -> QDQ int8 graph calibrated on ``calibration_frames`` [N, B, 3, R, R].

    ``feeds`` replaces the stream-with-state feeds for a graph with other inputs (the window graph), which
    then needs ``tower`` for the backbone policy (a step graph's metadata gives it).
    """
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if method not in CALIBRATION_METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose from {', '.join(CALIBRATION_METHODS)}")
    if activations not in INT8_ACTIVATIONS:
        raise ValueError(f"unknown int8 activations {activations!r}; choose from {', '.join(INT8_ACTIVATIONS)}")
    float_blocks = float_blocks if policy == BACKBONE_POLICY else 0
    symmetric = activations == SYMMETRIC_ACTIVATIONS
    if tower is None and policy == BACKBONE_POLICY and feeds is None:
        from .graphs import read_metadata

        tower = TowerShape.from_description(read_metadata(fp32_graph))
    if feeds is None:
        feeds = calibration_feeds(fp32_graph, calibration_frames, query_embeddings)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(fp32_graph), str(prepared), skip_symbolic_shape=True)
        graph = onnx.load(str(prepared), load_external_data=False)
        quantize, kept, activation_products = select_products(graph, policy, tower, float_blocks)
        chosen = set(quantize)
        if _unshare_initializers(graph, chosen):
            onnx.save(graph, str(prepared))
        quantize_static(
            str(prepared), str(out_path), _FeedReader(feeds),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(WEIGHT_PRODUCT_OPS),
            per_channel=True,
            reduce_range=INT8_WEIGHT_BITS == 7,  # ONNX Runtime's name for 7-bit weights
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, CALIBRATION_METHODS[method]),
            extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True,
                           "OpTypesToExcludeOutputQuantization": list(WEIGHT_PRODUCT_OPS)},
            nodes_to_exclude=[n.name for n in graph.graph.node if n.name not in chosen],
        )
    return Int8Quantization(policy, method, len(calibration_frames), len(quantize), len(kept),
                            len(activation_products), activations, float_blocks)
