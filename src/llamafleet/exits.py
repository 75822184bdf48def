"""The exit codes of ``llamafleet serve``, ``plan``, ``consistency`` and ``model``: one per kind of error, so that a
script can tell a typo in the configuration from a missing model file or a busy port (docs/OPERATIONS.md, "Exit
codes"). ``check-env`` keeps its own verdicts (0 passed, 1 warnings, 2 failures)."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    NO = 1  # the command ran and its answer is no: a plan that does not fit, a consistency check that failed
    USAGE = 2  # a flag, a config key or a file the configuration names (API keys, inventory): the message names it
    MODEL = 3  # the model file: not found, not a GGUF file llamafleet can read, the demo model not fetched
    MACHINE = 4  # this machine cannot do it: the port is taken or not this host's, a Python package is missing
    LOAD = 5  # the server started, but a model it had to load at start failed to load (the log says why)
    INTERRUPTED = 130  # Ctrl-C before the command was done (128 + SIGINT, as shells report it)
    PIPE = 141  # the reader of its output went away (`plan | head`): 128 + SIGPIPE, as shells report a C program's
