"""The PyTorch engine: LLaMA checkpoints in Hugging Face's layout (``config.json``, ``*.safetensors``, the tokenizer)
served through ``transformers``, behind the same worker protocol as the llama.cpp engine (the ``torch`` extra)."""
