"""The ONNX multi-device formalism, framework-neutral (onnx + numpy only)."""
