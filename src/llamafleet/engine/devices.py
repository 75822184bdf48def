"""Which device each layer of a model runs on, by llama.cpp's rule: shared by the planner (memory per device) and
the torch engine (its device map for a layer split), so both engines split a model the same way."""

from __future__ import annotations

import bisect

import numpy as np

HOST = -1  # device index for "stays in host memory"


def layer_devices(n_layer: int, ratios: tuple[float, ...], n_gpu_layers: int = -1) -> tuple[int, ...]:
    """The device of each layer and, last, of the output head (``HOST`` where not offloaded), as llama.cpp assigns.

    ``n_gpu_layers`` -1 offloads everything (llama.cpp counts the output head as layer ``n_layer``).
    """
    n_dev = len(ratios)
    if n_dev == 0:
        return (HOST,) * (n_layer + 1)
    offloaded = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    first = max(n_layer + 1 - offloaded, 0)
    # llama.cpp works in float32; doing the same keeps boundary layers on the same side.
    splits = np.cumsum(np.asarray(ratios, dtype=np.float32), dtype=np.float32)
    splits = (splits / splits[-1]).astype(np.float32).tolist()
    out = []
    for il in range(n_layer + 1):
        if il < first:
            out.append(HOST)
            continue
        x = float(np.float32(il - first) / np.float32(offloaded))
        out.append(min(bisect.bisect_right(splits, x), n_dev - 1))
    return tuple(out)
