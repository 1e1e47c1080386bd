"""Numerical tolerances that define "equal" across forms and formats (DESIGN.md section 5)."""

# Step form against window form, and ONNX against PyTorch, fp32, on L2-normalized embeddings.
FP32_EMBEDDING_ATOL = 1e-4
