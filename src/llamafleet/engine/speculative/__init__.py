"""Speculative decoding inside continuous batching: draft sources, the per-step policy, verification."""
