"""Small pieces of OpenAI response bodies shared by the endpoints: usage and logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gossamer.runner.sampler import TokenLogprobs
from gossamer.tokenizer import Tokenizer


def chat_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int
) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as readable text (a piece of a UTF-8 character shows as U+FFFD; `bytes` has
    the exact bytes)."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def chat_logprob_entries(
    tokenizer: Tokenizer, logprobs: Sequence[TokenLogprobs], top_count: int
) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries: token, logprob, bytes, top_logprobs."""
    return [
        {
            **_chat_token(tokenizer, entry.token_id, entry.logprob),
            "top_logprobs": [
                _chat_token(tokenizer, token_id, logprob)
                for token_id, logprob in entry.top[:top_count]
            ],
        }
        for entry in logprobs
    ]


def _chat_token(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    return {
        "token": token_text(tokenizer, token_id),
        "logprob": _finite(logprob),
        "bytes": list(tokenizer.token_bytes(token_id)),
    }


def _finite(logprob: float) -> float:
    """JSON has no -inf; OpenAI clients expect a number."""
    return max(float(logprob), -9999.0)


class LegacyLogprobs:
    """`/v1/completions` logprobs: parallel lists tokens / token_logprobs / top_logprobs /
    text_offset (offsets count characters from the start of the choice's text)."""

    def __init__(self, tokenizer: Tokenizer, top_count: int, text_offset: int = 0) -> None:
        self._tokenizer = tokenizer
        self._top_count = top_count
        self.offset = text_offset

    def entries(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None]
    ) -> dict[str, list[Any]]:
        body: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for position, token_id in enumerate(token_ids):
            entry = logprobs[position] if position < len(logprobs) else None
            text = token_text(self._tokenizer, token_id)
            body["tokens"].append(text)
            body["text_offset"].append(self.offset)
            self.offset += len(text)
            if entry is None:
                body["token_logprobs"].append(None)
                body["top_logprobs"].append(None)
                continue
            body["token_logprobs"].append(_finite(entry.logprob))
            top = {
                token_text(self._tokenizer, token_id): _finite(logprob)
                for token_id, logprob in entry.top[: self._top_count]
            }
            body["top_logprobs"].append(top)
        return body


def extend_legacy(total: dict[str, list[Any]] | None, part: dict[str, list[Any]]) -> dict:
    if total is None:
        return {key: list(values) for key, values in part.items()}
    for key, values in part.items():
        total[key].extend(values)
    return total
