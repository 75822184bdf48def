"""A download's progress as log lines: bytes, share, rate and ETA while it runs, one line when done."""

from __future__ import annotations

import logging

import pytest

from llamafleet.model.progress import LogProgress, eta, size


def test_progress_lines_say_bytes_rate_and_eta(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="llamafleet.download")
    bar = LogProgress(total=4_000_000, desc="(…)resolve/abc/model-Q4_K_M.gguf", unit="B", unit_scale=True)
    bar.every_s = 0.0
    bar.update(1_000_000)
    line = caplog.messages[-1]
    assert line.startswith("downloading model-Q4_K_M.gguf: 1.0 MB of 4.0 MB (25%), ")
    assert "/s, ETA " in line
    bar.update(3_000_000)
    bar.close()
    assert caplog.messages[-1].startswith("downloaded model-Q4_K_M.gguf: 4.0 MB of 4.0 MB (100%)")


def test_sizes_and_times_read_like_tqdm() -> None:
    assert [size(n) for n in (999, 1500, 2.5e6, 3e9, 4e12)] == ["999 B", "1.5 kB", "2.5 MB", "3.0 GB", "4.00 TB"]
    assert [eta(s) for s in (None, 5, 125, 7325)] == ["?", "0m05s", "2m05s", "2h02m"]
