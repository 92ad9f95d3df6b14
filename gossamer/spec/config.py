"""`SpecConfig`: what `--speculative-config` says, in the style of vLLM's JSON.

    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
                           "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    --speculative-config '{"method": "draft", "model": "/ckpt/gpt-oss-20b"}'
    --speculative-config '{"method": "eagle3", "model": "/ckpt/gpt-oss-120b-eagle3"}'
    --speculative-config auto              # ngram + suffix, chosen per request
    --speculative-config '{"method": "auto", "model": "/ckpt/gpt-oss-20b"}'   # + a draft model
    --speculative-config '{"method": "eagle3", "model": "/ckpt/e3", "tree": {"branching": [3, 2, 1]}}'

The value is JSON, the path of a .json file, or a bare method name. This module imports nothing
heavy: the engine config can hold a `SpecConfig` without loading any proposer.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gossamer.spec.tree import TreeShape, TreeShapeError, parse_tree

METHODS = ("ngram", "suffix", "draft", "eagle3", "auto")
MODEL_METHODS = ("draft", "eagle3")


class SpecConfigError(ValueError):
    """A speculative config that cannot run; the message says which field and why."""


@dataclass(frozen=True)
class SpecConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    # ngram (prompt lookup): match the last n tokens, n from max down to min.
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    # draft / eagle3: a checkpoint folder. For "auto" it adds that proposer to ngram + suffix.
    model: str | None = None
    draft_load_format: str = "auto"  # "dummy": random weights of a preset (benchmarks)
    draft_num_blocks: int | None = None  # draft KV pool; None: the target's block count
    # suffix: a trie over n-grams of the request and of recent outputs of other requests.
    suffix_decoding_max_tree_depth: int = 16
    suffix_decoding_max_cached_requests: int = 256
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # When to stop speculating.
    disable_by_batch_size: int | None = None  # globally, while this many requests or more run
    min_acceptance_rate: float = 0.2  # per request, when the recent acceptance stays below
    acceptance_window: int = 8  # proposals the per-request acceptance average spans
    retry_after: int = 16  # engine steps a request stays off before trying again (then doubled)
    # "auto": the candidate methods (default: ngram, suffix and, with "model", its method).
    methods: tuple[str, ...] = ()
    # Pad every decode's draft with never-accepted filler to one length of `draft_len_ladder`,
    # so that verification steps have a CUDA graph's uniform shape (docs/speculative.md).
    pad_drafts: bool = True
    # Choose each step's k (0: no speculation) for the most expected tokens per unit of step cost
    # (gossamer/spec/cost.py). None: on for "auto", off for a single method.
    cost_aware: bool | None = None
    # The step cost model: {batch: [cost at k = 0, 1, 2, ...]} or {batch: {k: cost}} (any unit, as
    # ms; each row is taken relative to its k = 0), or the path of a .json file holding that
    # (optionally under "cost_table": what `benchmarks/spec_decode.py verify-cost --cost-table`
    # writes). None: measured at engine start-up on the GPU with CUDA graphs
    # (gossamer/spec/calibrate.py), else the built-in H200 gpt-oss-120b table.
    cost_table: Any = None
    # Charge the proposers' measured host time per request (python lookups, a draft model's
    # passes) against speculating, in plain steps (gossamer/spec/cost.py). Off: drafts are free.
    charge_proposer_time: bool = True
    # Check the choice against the wall clock per batch-size bucket, and keep speculation off
    # where plain steps make requests wait less per token (gossamer/spec/guard.py). None: on for
    # "auto", off for a single method (as cost_aware). On gpt-oss-mini on the H200 against
    # overlapped plain decoding (BENCHMARKS.md, seventh session) auto ran 1.29x / 0.75x at batch
    # 1 / 8 with the guard and 0.89x / 0.43x without; the guard now also counts what it left out
    # then (index builds, amortized over their requests' lives; the requests speculation slows).
    # The eighth session's 256-token runs of that (0.92x / 0.78x; unguarded 1.20x / 0.68x) were
    # too short and noisy to rank the versions: see BENCHMARKS.md. Every `explore_every`
    # decode-only steps of a bucket (more while the other mode keeps losing), `explore_steps`
    # steps run the other mode; it switches when that mode is faster by more than `guard_margin`.
    measured_guard: bool | None = None
    explore_every: int = 128
    explore_steps: int = 8
    guard_margin: float = 0.05
    # draft / eagle3: tree drafts instead of chains (gossamer/spec/tree.py): {"branching": [3, 2,
    # 1, 1]} (the top-k children of every node, per depth) or {"paths": [[0], [1], [0, 0], ...]}
    # (EAGLE-style rank paths). Its depth must not exceed num_speculative_tokens; every node is a
    # token of the verification step. None: chains.
    tree: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "cost_table", _cost_table(self.cost_table))
        try:
            object.__setattr__(self, "tree", parse_tree(self.tree))
        except TreeShapeError as error:
            raise SpecConfigError(f"speculative config: tree {error}") from error
        for name, ok, message in self._checks():
            if not ok:
                raise SpecConfigError(f"speculative config: {name} {message}")

    def _checks(self) -> list[tuple[str, bool, str]]:
        needs_model = self.method in MODEL_METHODS
        return [
            ("method", self.method in METHODS, f"must be one of {', '.join(METHODS)}"),
            ("num_speculative_tokens", 1 <= self.num_speculative_tokens <= 32, "must be in 1..32"),
            ("prompt_lookup_min", self.prompt_lookup_min >= 1, "must be at least 1"),
            (
                "prompt_lookup_max",
                self.prompt_lookup_max >= self.prompt_lookup_min,
                "must be at least prompt_lookup_min",
            ),
            ("model", self.model is not None or not needs_model, f"is required by {self.method}"),
            ("draft_load_format", self.draft_load_format in ("auto", "dummy"), "is auto or dummy"),
            (
                "draft_num_blocks",
                self.draft_num_blocks is None or self.draft_num_blocks >= 2,
                "must be at least 2",
            ),
            ("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth >= 2, ">= 2"),
            (
                "suffix_decoding_max_cached_requests",
                self.suffix_decoding_max_cached_requests >= 0,
                "must not be negative",
            ),
            ("suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor > 0, "> 0"),
            (
                "suffix_decoding_min_token_prob",
                0 <= self.suffix_decoding_min_token_prob <= 1,
                "must be in [0, 1]",
            ),
            (
                "disable_by_batch_size",
                self.disable_by_batch_size is None or self.disable_by_batch_size >= 1,
                "must be at least 1",
            ),
            ("min_acceptance_rate", 0 <= self.min_acceptance_rate <= 1, "must be in [0, 1]"),
            ("acceptance_window", self.acceptance_window >= 1, "must be at least 1"),
            ("retry_after", self.retry_after >= 1, "must be at least 1"),
            (
                "measured_guard",
                self.measured_guard is None or isinstance(self.measured_guard, bool),
                "must be true, false or null",
            ),
            ("explore_every", _is_count(self.explore_every, 1), "must be an integer >= 1"),
            ("explore_steps", _is_count(self.explore_steps, 1), "must be an integer >= 1"),
            ("guard_margin", 0 <= self.guard_margin < 1, "must be in [0, 1)"),
            (
                "methods",
                all(m in METHODS and m != "auto" for m in self.methods),
                f"entries must be among {', '.join(METHODS[:-1])}",
            ),
            *self._tree_checks(),
        ]

    def _tree_checks(self) -> list[tuple[str, bool, str]]:
        tree: TreeShape | None = self.tree
        if tree is None:
            return []
        return [
            ("tree", self.method in MODEL_METHODS, "needs method draft or eagle3"),
            ("tree", not self.cost_aware, "does not work with cost_aware (a cost per chain k)"),
            (
                "tree",
                tree.max_depth <= self.num_speculative_tokens,
                f"has depth {tree.max_depth}: set num_speculative_tokens to at least that",
            ),
        ]

    @property
    def chooses_k(self) -> bool:
        """Whether the speculator picks each step's k by the cost model."""
        return self.method == "auto" if self.cost_aware is None else self.cost_aware

    @property
    def guards_speculation(self) -> bool:
        """Whether the measured guard may turn speculation off per batch-size bucket."""
        return self.method == "auto" if self.measured_guard is None else self.measured_guard

    @property
    def draft_len_ladder(self) -> tuple[int, ...]:
        """The draft lengths k that verification graphs are captured for (query length 1 + k) and
        that padded drafts are rounded up to: powers of two below num_speculative_tokens, and
        num_speculative_tokens itself. Padding then at most about doubles a step's drafts, with
        log2(k) graphs per batch size instead of k."""
        top = self.num_speculative_tokens
        powers = [1 << i for i in range(top.bit_length()) if 1 << i < top]
        return (*powers, top)

    @property
    def proposer_methods(self) -> tuple[str, ...]:
        """The proposers to build: the method itself, or the candidates of "auto"."""
        if self.method != "auto":
            return (self.method,)
        if self.methods:
            return self.methods
        extra = (model_method(self.model),) if self.model else ()
        return ("ngram", "suffix", *extra)


def _is_count(value: Any, least: int) -> bool:
    """An integer (not a bool, not a float) of at least `least`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def model_method(path: str) -> str:
    """The method of a checkpoint: "eagle3" for an EAGLE-3 head (by config.json), else "draft"."""
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        return "draft"  # a preset name with dummy weights
    raw = json.loads(config_path.read_text())
    architectures = " ".join(raw.get("architectures") or ())
    return "eagle3" if "eagle3" in architectures.lower() else "draft"


CostTable = tuple[tuple[int, tuple[tuple[int, float], ...]], ...]


def _cost_table(value: Any) -> CostTable | None:
    """A cost table from JSON-like input, as sorted (batch, ((k, cost), ...)) rows; raises
    SpecConfigError with what is wrong."""
    if value is None:
        return None
    if isinstance(value, str):
        value = _read_cost_file(value)
    if isinstance(value, dict) and "cost_table" in value:  # a benchmark's file, with metadata
        value = value["cost_table"]
    rows = value.items() if isinstance(value, dict) else value
    try:
        table = tuple(sorted((int(batch), _cost_points(points)) for batch, points in rows))
    except (TypeError, ValueError) as error:
        raise SpecConfigError(
            "speculative config: cost_table must map batch sizes to [cost at k = 0, 1, ...] or "
            f'{{k: cost}}, e.g. {{"1": [4.29, 5.62, 6.9]}} ({error})'
        ) from error
    for batch, points in table:
        distinct = len({k for k, _ in points}) == len(points)
        if batch < 1 or len(points) < 2 or points[0][0] != 0 or not distinct:
            raise SpecConfigError(
                f"speculative config: cost_table row {batch} needs a batch >= 1 and one cost at "
                "k = 0 and at each of at least one other k"
            )
        if any(cost <= 0 for _, cost in points) or any(k < 0 for k, _ in points):
            raise SpecConfigError(f"speculative config: cost_table row {batch}: costs must be > 0")
    if not table:
        raise SpecConfigError("speculative config: cost_table is empty")
    return table


def _cost_points(points: Any) -> tuple[tuple[int, float], ...]:
    """{k: cost}, [cost at k = 0, 1, ...] or ((k, cost), ...) (already normalised)."""
    if isinstance(points, dict):
        pairs = points.items()
    elif all(isinstance(point, (list, tuple)) for point in points):
        pairs = points
    else:
        pairs = enumerate(points)
    return tuple(sorted((int(k), float(cost)) for k, cost in pairs))


def _read_cost_file(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        message = f"speculative config: cannot read cost_table {path!r}: {error}"
        raise SpecConfigError(message) from error


def parse_spec_config(value: str | dict[str, Any] | SpecConfig | None) -> SpecConfig | None:
    """JSON text, a .json path, a bare method name or a dict -> SpecConfig (None stays None)."""
    if value is None or isinstance(value, SpecConfig):
        return value
    if isinstance(value, str):
        value = _load_text(value.strip())
    if not isinstance(value, dict):
        raise SpecConfigError("the speculative config must be a JSON object or a method name")
    known = {f.name for f in fields(SpecConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise SpecConfigError(
            f"speculative config: unknown keys {unknown}; known keys are {sorted(known)}"
        )
    if isinstance(value.get("methods"), list):
        value = value | {"methods": tuple(value["methods"])}
    try:
        return SpecConfig(**value)
    except TypeError as error:  # a value of the wrong type, e.g. a string for a count
        raise SpecConfigError(f"speculative config: {error}") from error


def _load_text(text: str) -> Any:
    if text in METHODS:
        return {"method": text}
    if not text.startswith("{") and Path(text).is_file():
        text = Path(text).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecConfigError(
            f"--speculative-config is neither JSON nor a method name ({error}); e.g. "
            '\'{"method": "ngram", "num_speculative_tokens": 4}\''
        ) from error


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='speculative decoding, JSON like vLLM\'s: \'{"method": "ngram", '
        '"num_speculative_tokens": 4}\'; methods: ngram, suffix, draft (+ "model"), '
        'eagle3 (+ "model", either optionally + "tree": {"branching": [3, 2, 1, 1]}), auto; '
        "or a .json path, or a bare method name",
    )


def spec_config_from_args(args: argparse.Namespace) -> SpecConfig | None:
    return parse_spec_config(getattr(args, "speculative_config", None))
