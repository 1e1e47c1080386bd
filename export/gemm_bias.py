"""fp16 step graphs carry each linear layer as MatMul, then Add of its bias, not as one Gemm.

ONNX Runtime's CUDA provider runs a Gemm with a bias as two kernels: one writes the bias into every row of
the output (``BroadcastBiasKernel``), then the GEMM multiplies onto it (beta = 1). That bias kernel was 15%
of the GPU's time at one stream and 27% at 32 (ViT-B/16 + QRNN fp16 step, H200, CUPTI). As MatMul then Add
it is still two kernels, the Add an elementwise one that runs faster: measured on that H200, interleaved, the
32-stream step 14.88 -> 13.42 ms (1.11x), the backbone's 11.25 -> 10.47 ms, one stream 2.17 against 2.15 ms.

Only the fp16 graph, the GPU format, is written so. ONNX Runtime's CPU provider folds the pair back into its
Gemm (``MatMulAddFusion``: the same kernels, the same numbers), the CUDA session keeps the two apart
(``runtime.ort_releases.CUDA_DISABLED_OPTIMIZERS``), and TensorRT fuses the bias into its GEMM.
"""

from __future__ import annotations

import numpy as np


def split_gemm_bias(graph) -> int:
    """Rewrite, in ``graph`` (an ``onnx.ModelProto``), every ``Gemm(A, W, b)`` whose weight and 1-D bias are
    constants (alpha = beta = 1, A not transposed) as ``Add(MatMul(A, W'), b)``, W' in the [in, out] layout
    MatMul takes; returns how many were rewritten. Output names are kept, so nothing downstream changes."""
    from onnx import helper, numpy_helper

    initializers = {i.name: i for i in graph.graph.initializer}
    # The tracer hands a constant that two layers share to the second through an Identity node.
    initializers.update({n.output[0]: initializers[n.input[0]] for n in graph.graph.node
                         if n.op_type == "Identity" and n.input[0] in initializers})
    nodes, rewritten, transposed = [], 0, {}
    for node in graph.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight, bias = (node.input[1], node.input[2]) if len(node.input) == 3 else (None, None)
        # A transposed A (the one-stream attention's output projection) stays a Gemm: as a MatMul it would need
        # a Transpose that the CPU's Gemm does not.
        if (node.op_type != "Gemm" or weight not in initializers or bias not in initializers
                or len(initializers[bias].dims) != 1 or attributes.get("transA", 0)
                or attributes.get("alpha", 1.0) != 1.0 or attributes.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        if attributes.get("transB", 0):
            source = initializers[weight]
            if source.name not in transposed:  # a weight two layers share is transposed once
                matrix = np.ascontiguousarray(numpy_helper.to_array(source).T)
                transposed[source.name] = numpy_helper.from_array(matrix, f"{source.name}.in_out")
            weight = transposed[source.name].name
        product = f"{node.output[0]}.product"
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}.product"))
        nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}.bias"))
        rewritten += 1
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    graph.graph.initializer.extend(transposed.values())
    used = {name for node in nodes for name in node.input} | {output.name for output in graph.graph.output}
    kept = [i for i in graph.graph.initializer if i.name in used]  # the [out, in] weights no node reads now
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)
    return rewritten
