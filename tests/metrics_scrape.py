"""Scraping a server's `/metrics` in tests: every sample by name and labels,
parsed by prometheus-client's own parser."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(address: str) -> Samples:
    """Every sample `GET http://ADDRESS/metrics` answers."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        answer = await client.get(f"http://{address}/metrics")
    answer.raise_for_status()
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sample `name{labels}`, 0 when absent (a series not yet made)."""
    return samples.get((name, frozenset((labels or {}).items())), 0.0)


def delta(
    before: Samples, after: Samples, name: str, labels: Mapping[str, str] | None = None
) -> float:
    """How much `name{labels}` moved between two scrapes."""
    return value(after, name, labels) - value(before, name, labels)
