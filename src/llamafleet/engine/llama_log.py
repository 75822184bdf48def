"""llama.cpp's log text, turned into Python ``logging`` lines under the logger ``llamafleet.llama_cpp``.

llama.cpp logs in fragments (level 5 continues the previous line), so text is buffered until a newline. The ctypes
callback that feeds :func:`on_log` is in :mod:`llamafleet.engine.llama_backend`; this part needs no llama.cpp.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("llamafleet.llama_cpp")

# ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 "continue the previous line".
_GGML_TO_PY = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_PY_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_state: dict[str, Any] = {"min": logging.WARNING, "level": logging.INFO, "buf": ""}
_lock = threading.Lock()


def set_level(name: str) -> None:
    """Pass on llama.cpp's lines at ``name`` ("debug", "info", "warning", "error") and above."""
    _state["min"] = _PY_LEVELS.get(name, logging.WARNING)


def on_log(level: int, text: bytes | None) -> None:
    with _lock:
        if level != 5:
            _state["level"] = _GGML_TO_PY.get(level, logging.INFO)
        py_level = _state["level"]
        if py_level < _state["min"] or not text:
            return
        buf = _state["buf"] + text.decode("utf-8", errors="replace")
        *lines, rest = buf.split("\n")
        _state["buf"] = rest
    for line in lines:
        if line.strip():
            log.log(py_level, "%s", line.rstrip())

