"""llamafleet: serve LLaMA-family GGUF models across every GPU of a machine."""

__version__ = "0.1.0"
