"""`specrt bench`: target-only vs speculative (vs onnxruntime-genai), interleaved in one run."""
