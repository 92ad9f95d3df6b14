"""Speculative-decoding counters read from a server's Prometheus /metrics around a run.

Gossamer exports `gossamer_spec_decode{stat=...}`; vLLM exports `vllm:spec_decode_num_drafts_total`
and friends. The difference of the cumulative counters over the run gives its own acceptance
rate and mean accepted length. Best effort: a server without them gives None.
"""

from __future__ import annotations

from typing import Any

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
VLLM_NAMES = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


async def scrape_spec_counters(base_url: str, headers: dict[str, str]) -> dict[str, float] | None:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(base_url.rstrip("/") + "/metrics", headers=headers)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_spec_counters(response.text)


def parse_spec_counters(text: str) -> dict[str, float] | None:
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            stat = sample.labels.get("stat") if family.name == "gossamer_spec_decode" else None
            # the parser may keep or strip a counter's _total suffix, depending on the # TYPE line
            vllm_name = VLLM_NAMES.get(family.name.removesuffix("_total"))
            name = stat if stat in COUNTERS else vllm_name
            if name is not None and not sample.name.endswith("_created"):
                found[name] = sample.value
    return found if set(found) == set(COUNTERS) else None


def spec_summary(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """Counters over the run, with acceptance rate and mean accepted length (tokens emitted per
    verified proposal, the target's own token included, as vLLM defines it)."""
    if after is None:
        return {}
    before = before or dict.fromkeys(COUNTERS, 0.0)  # counters appear with the first draft
    delta = {name: after[name] - before[name] for name in COUNTERS}
    drafts, drafted, accepted = (delta[name] for name in COUNTERS)
    return delta | {
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": 1 + accepted / drafts if drafts else None,
    }
