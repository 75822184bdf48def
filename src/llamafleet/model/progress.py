"""A download's progress as a server's log shows it: a line every few seconds with the bytes, rate and ETA that
tqdm's bar shows on a terminal (``huggingface_hub`` draws its bars through the class it is handed)."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

log = logging.getLogger("llamafleet.download")


def size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:.2f} TB"


def eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class LogProgress(tqdm):  # type: ignore[type-arg]
    """tqdm's counting, written to the log (``llamafleet.download``) every ``every_s`` seconds and at the end."""

    every_s = 5.0
    sink: Callable[[float], None] | None = None  # also told every increment (a server's record of a pull)

    @classmethod
    def feeding(cls, sink: Callable[[float], None]) -> type[LogProgress]:
        """This class, telling ``sink`` of every increment (``huggingface_hub`` takes a class, not an instance)."""
        return type(cls.__name__, (cls,), {"sink": staticmethod(sink)})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["file"] = io.StringIO()  # the bar itself goes nowhere; the log lines say it
        kwargs.pop("disable", None)
        super().__init__(*args, **kwargs)
        self.desc = self.desc.rsplit("/", 1)[-1]  # huggingface_hub names a bar by its URL's tail
        self._logged = time.monotonic()

    def line(self) -> str:
        d = self.format_dict
        n, total, elapsed = d["n"], d["total"], d["elapsed"]
        rate = d["rate"] or ((n - self.initial) / elapsed if elapsed > 0 else None)
        left = (total - n) / rate if rate and total else None
        of = f" of {size(total)} ({100 * n / total:.0f}%)" if total else ""
        return (f"downloading {self.desc}: {size(n)}{of}, {size(rate) + '/s' if rate else '? /s'}, "
                f"ETA {eta(left)}")

    def update(self, n: float | None = 1) -> bool | None:
        shown = super().update(n)
        if self.sink is not None:
            self.sink(n or 0)
        now = time.monotonic()
        if now - self._logged >= self.every_s:
            self._logged = now
            log.info("%s", self.line())
        return shown

    def close(self) -> None:
        if not self.disable and self.total and self.n >= self.total:
            log.info("%s", self.line().replace("downloading", "downloaded", 1))
        super().close()
