"""GGUF model files: read a header, write a synthetic model, fetch the demo model or a model from the hub."""
