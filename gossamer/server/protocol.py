"""Request bodies of the OpenAI-compatible endpoints (pydantic).

Only requests are modelled: they need validation with field names for the error's `param`.
Responses are built as plain dicts (faster, and the shapes are documented where they are built).
Unknown fields are ignored, as vLLM does, so newer clients keep working.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ReasoningEffort = Literal["low", "medium", "high"]
NonNegativeInt = Annotated[int, Field(ge=0)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """Sampling fields shared by all generation endpoints (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    # vLLM extra body fields
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: NonNegativeInt = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    cache_salt: str | None = None


# -- chat completions ---------------------------------------------------------------------------


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class ResponseFormat(_Body):
    type: str


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]]
    n: int = 1
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    reasoning_effort: ReasoningEffort | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None


# -- completions --------------------------------------------------------------------------------


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    n: int = 1
    best_of: int | None = None
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    skip_special_tokens: bool = True


# -- responses ----------------------------------------------------------------------------------


class ResponsesReasoning(_Body):
    effort: ReasoningEffort | None = None
    summary: str | None = None


class ResponsesFunctionTool(_Body):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedToolChoice(_Body):
    type: Literal["function"]
    name: str


class ResponsesRequest(SamplingFields):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    reasoning: ResponsesReasoning | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool = True
    metadata: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    top_logprobs: int | None = None
