"""Reading a server's ``/metrics`` in tests: one sample's value from the Prometheus text."""

from __future__ import annotations

import re

import httpx


def scrape(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=30).text


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` (labels in the order the server writes them); 0 if absent."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0
