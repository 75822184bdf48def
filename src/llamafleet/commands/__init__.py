"""One module per ``llamafleet`` sub-command. Each exposes ``register(sub)``, which adds its parser and sets
``func`` to its ``run(args) -> int`` (the exit code); errors go to stderr as ``error: ...``. A module imports at its
top only what building its parser needs; ``run`` imports the rest (see :mod:`llamafleet.cli`)."""
