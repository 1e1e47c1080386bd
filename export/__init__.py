"""sdqes_edge.export: from a model to a deployment bundle (torch, onnx, onnxruntime).

The exporter traces ``ImageTower.step`` (the same definition the window form
uses) into the single-step ONNX graph described in DESIGN.md section 3; its
state inputs and outputs come from ``ImageTower.state_spec``.
"""
