"""What every endpoint handler needs: the engine, the metrics, the served names, and the
request checks shared by the generation endpoints (model name, sampling params, token limits)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gossamer.sampling_params import SamplingParams, SamplingParamsError
from gossamer.server.engine_api import EngineClient
from gossamer.server.errors import UNAVAILABLE, ApiError, bad_request
from gossamer.server.metrics import ServerMetrics
from gossamer.server.protocol import SamplingFields

MAX_LOGPROBS = 20


@dataclass
class ServerContext:
    engine: EngineClient
    metrics: ServerMetrics
    served_model_names: list[str]
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_ready(self) -> None:
        if not self.engine.is_ready():
            raise ApiError(503, "the model is still loading; retry shortly", UNAVAILABLE)

    def check_model(self, model: str | None) -> str:
        """The name to report for a request that asked for `model` (None: the default)."""
        if model is None or model in self.served_model_names:
            return model or self.model_name
        raise ApiError(
            404,
            f"The model `{model}` does not exist. This server serves: "
            f"{', '.join(self.served_model_names)}.",
            param="model",
            code="model_not_found",
        )


def resolve_max_tokens(
    requested: int | None, param: str, prompt_len: int, max_model_len: int, prompt_param: str
) -> int:
    """The output budget: what was asked for, checked against the context; by default all of
    the context the prompt leaves."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt "
            f"has {prompt_len} tokens. Shorten the prompt.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    room = max_model_len - prompt_len
    if requested is None:
        return room
    if requested < 1:
        raise bad_request(f"'{param}' must be at least 1, got {requested}.", param=param)
    if requested > room:
        raise bad_request(
            f"'{param}' is too large: {requested}. This model's maximum context length is "
            f"{max_model_len} tokens and the prompt has {prompt_len} tokens, which leaves at "
            f"most {room} for the output.",
            param=param,
        )
    return requested


def check_logprobs(count: int | None, param: str) -> None:
    if count is not None and not 0 <= count <= MAX_LOGPROBS:
        raise bad_request(f"'{param}' must be between 0 and {MAX_LOGPROBS}.", param=param)


def build_sampling_params(
    body: SamplingFields,
    *,
    n: int,
    max_tokens: int,
    stop_token_ids: Sequence[int],
    logprobs: int | None,
    skip_special_tokens: bool = True,
) -> SamplingParams:
    """SamplingParams from the request fields; range errors become HTTP 400 naming the field."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    try:
        return SamplingParams(
            n=n,
            temperature=_or(body.temperature, 1.0),
            top_p=_or(body.top_p, 1.0),
            top_k=_or(body.top_k, 0),
            min_p=_or(body.min_p, 0.0),
            seed=body.seed,
            presence_penalty=_or(body.presence_penalty, 0.0),
            frequency_penalty=_or(body.frequency_penalty, 0.0),
            repetition_penalty=_or(body.repetition_penalty, 1.0),
            max_tokens=max_tokens,
            min_tokens=body.min_tokens,
            stop=tuple(stop),
            stop_token_ids=(*stop_token_ids, *(body.stop_token_ids or ())),
            ignore_eos=body.ignore_eos,
            include_stop_str_in_output=body.include_stop_str_in_output,
            logprobs=logprobs,
            skip_special_tokens=skip_special_tokens,
        )
    except SamplingParamsError as error:
        raise bad_request(str(error), param=error.param) from error


def _or(value, default):  # type: ignore[no-untyped-def]
    return default if value is None else value
