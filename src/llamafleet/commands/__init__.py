"""One module per ``llamafleet`` sub-command; each exposes ``register(subparsers)``."""
