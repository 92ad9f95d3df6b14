"""`gossamer bench`: measure an OpenAI-compatible server, or compare result files.

    gossamer bench [run] --base-url http://127.0.0.1:8000 --endpoint chat \\
        --workload random --input-len 1024 --output-len 256 --concurrency 1,4,16,64
    gossamer bench compare results/*.json --out-dir plots/

`run` (the default mode) writes one result JSON per sweep point into --result-dir and prints a
table per run; `compare` prints the runs side by side and writes PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gossamer.bench.errors import BenchConfigError
from gossamer.bench.workloads import WORKLOADS, WorkloadSpec

if TYPE_CHECKING:
    from gossamer.bench.client import ClientConfig
    from gossamer.bench.loadgen import LoadConfig
    from gossamer.bench.metrics import Slo
    from gossamer.bench.prompts import PromptBuilder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    _add_run_arguments(parser)  # so that plain `gossamer bench --base-url ...` runs
    modes = parser.add_subparsers(dest="bench_mode", metavar="{run,compare}")
    _add_run_arguments(modes.add_parser("run", help="benchmark a server (the default)"))
    compare = modes.add_parser("compare", help="compare result files: table and PNG plots")
    compare.add_argument("results", nargs="+", help="result JSON files written by `run`")
    compare.add_argument("--out-dir", default="bench-plots", help="where the PNGs go")
    compare.add_argument("--no-plots", action="store_true", help="print the table only")


def run(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "bench_mode", None) == "compare":
            return _compare(args)
        return _run_benchmark(args)
    except BenchConfigError as exc:
        print(f"gossamer bench: error: {exc}", file=sys.stderr)
        return 2


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="server root, with or without a trailing /v1",
    )
    server.add_argument(
        "--endpoint",
        choices=("chat", "completions", "responses"),
        default="chat",
        help="/v1/chat/completions, /v1/completions or /v1/responses",
    )
    server.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    server.add_argument(
        "--label",
        help="name of this engine/config in results and plots "
        "(default: the model's owned_by, e.g. vllm, sglang)",
    )
    server.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)",
    )
    server.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra HTTP header; repeatable",
    )
    server.add_argument(
        "--extra-body",
        default="{}",
        metavar="JSON",
        help="JSON object merged into every request body",
    )
    server.add_argument("--temperature", type=float, help="sampling temperature to send")
    server.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send ignore_eos=true and min_tokens=max tokens for fixed output "
        "lengths (default: on for synthetic workloads, off for sharegpt; turn off "
        "for servers that reject unknown fields, e.g. hosted APIs)",
    )
    server.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a request still running after this long fails as Timeout",
    )

    workload = parser.add_argument_group("workload")
    workload.add_argument("--workload", choices=WORKLOADS, default="random")
    workload.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a folder with one) for exact "
        "prompt lengths; without it lengths are estimates",
    )
    workload.add_argument(
        "--input-len",
        type=int,
        default=1024,
        help="prompt tokens (prefix: question tokens; multiturn: per turn)",
    )
    workload.add_argument("--output-len", type=int, default=128, help="output tokens to ask for")
    workload.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="sample lengths uniformly in [len*(1-r), len*(1+r)]",
    )
    workload.add_argument("--dataset-path", help="ShareGPT JSON file for --workload sharegpt")
    workload.add_argument(
        "--sharegpt-output-len",
        type=int,
        help="override the output length taken from the ShareGPT reply",
    )
    workload.add_argument("--prefix-groups", type=int, default=4, help="shared system prompts")
    workload.add_argument(
        "--prefix-questions", type=int, default=8, help="questions per shared system prompt"
    )
    workload.add_argument(
        "--prefix-len", type=int, default=1024, help="tokens in each shared system prompt"
    )
    workload.add_argument("--turns", type=int, default=4, help="user turns per conversation")
    workload.add_argument("--seed", type=int, default=0, help="makes prompts and arrivals repeat")

    load = parser.add_argument_group("load")
    load.add_argument(
        "--concurrency",
        help="requests in flight at once; a list such as "
        "1,4,16,64 runs a sweep (default 1, or unlimited with --request-rate)",
    )
    load.add_argument(
        "--request-rate",
        default="inf",
        help="Poisson/gamma arrivals per second; "
        "a list sweeps; inf sends as fast as --concurrency allows",
    )
    load.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the gaps: 1 Poisson, <1 burstier, >1 more regular",
    )
    load.add_argument(
        "--num-prompts",
        type=int,
        help="requests per run (default max(50, 10 x concurrency), 200 uncapped)",
    )
    load.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="send new requests for this long instead of --num-prompts",
    )
    load.add_argument("--warmup", type=int, default=1, help="uncounted requests sent first")

    output = parser.add_argument_group("output")
    output.add_argument("--percentiles", default="90,99", help="latency percentiles to report")
    output.add_argument(
        "--slo", help="goodput SLOs in ms, e.g. ttft_ms=500,tpot_ms=50 (also ttfct_ms, e2el_ms)"
    )
    output.add_argument("--result-dir", default="bench-results", help="where result JSONs go")
    output.add_argument("--no-save", action="store_true", help="write no result files")
    output.add_argument(
        "--save-text", action="store_true", help="keep generated text in the per-request records"
    )
    output.add_argument("--no-progress", action="store_true", help="hide the progress bar")


# ---- run --------------------------------------------------------------------------------------


def _run_benchmark(args: argparse.Namespace) -> int:
    from gossamer.bench.client import ClientConfig
    from gossamer.bench.metrics import Slo
    from gossamer.bench.prompts import make_prompt_builder
    from gossamer.bench.report import sweep_table

    base_url = args.base_url.rstrip("/").removesuffix("/v1")
    if not base_url.startswith(("http://", "https://")):
        raise BenchConfigError(f"--base-url needs http:// or https://, got {args.base_url!r}")
    # Every option is checked before the server is contacted.
    headers = _headers(args)
    extra_body = _extra_body(args.extra_body)
    spec = _workload_spec(args)
    spec.validate()
    slo = Slo.parse(args.slo)
    percentiles = _float_list(args.percentiles, "--percentiles")
    sweep = _sweep_points(args)
    builder = make_prompt_builder(args.tokenizer)
    server = asyncio.run(probe_server(base_url, headers))
    model = args.model or server.get("model")
    if not model:
        raise BenchConfigError(
            f"could not list models at {base_url}/v1/models ({server.get('error')}); "
            "pass --model NAME"
        )
    ignore_eos = args.ignore_eos if args.ignore_eos is not None else spec.name != "sharegpt"
    client = ClientConfig(
        base_url=base_url,
        endpoint=args.endpoint,
        model=model,
        headers=headers,
        timeout_s=args.request_timeout,
        ignore_eos=ignore_eos,
        temperature=args.temperature,
        extra_body=extra_body,
    )
    label = args.label or server.get("owned_by") or "bench"
    results = []
    context = _RunContext(args, client, spec, builder, slo, percentiles, label, server)
    for index, (concurrency, rate) in enumerate(sweep):
        results.append(context.run(concurrency, rate, index))
    if len(results) > 1:
        print(sweep_table(results))
    return 0 if any(r["summary"]["completed"] for r in results) else 1


@dataclasses.dataclass
class _RunContext:
    args: argparse.Namespace
    client: ClientConfig
    spec: WorkloadSpec
    builder: PromptBuilder
    slo: Slo | None
    percentiles: list[float]
    label: str
    server: dict[str, Any]

    def run(self, concurrency: int | None, rate: float, index: int) -> dict[str, Any]:
        from gossamer.bench.metrics import fill_missing_token_counts, summarize
        from gossamer.bench.report import build_result, result_filename, run_table, write_result
        from gossamer.bench.workloads import conversations

        load = self._load_config(concurrency, rate)
        load.validate()
        # NOTE: each sweep point gets its own prompts (still fixed by --seed): reusing the
        # previous point's prompts would turn them into prefix-cache hits on the server.
        stream = conversations(self.spec, self.builder, f"{self.args.seed}/run{index}")
        warmup_stream = conversations(self.spec, self.builder, f"{self.args.seed}/warmup")
        outcome, spec = asyncio.run(self._load_with_server_counters(load, stream, warmup_stream))
        fill_missing_token_counts(outcome.records, self.builder)
        summary = summarize(outcome.records, outcome.duration_s, self.percentiles, self.slo)
        config = self._config(load, index)
        result = build_result(
            self.label,
            config,
            self.server,
            summary,
            outcome.records,
            outcome.warmup_records,
            save_text=self.args.save_text,
        )
        if spec:
            result["spec_decode"] = spec  # from /metrics, over this run and its warm-up
            print(f"speculative decoding: {spec}")
        if outcome.warmup_records:
            failed = result["warmup"]["failed"]
            print(f"warm-up: {len(outcome.warmup_records)} requests, {failed} failed (not counted)")
        print(run_table(result))
        if not self.args.no_save:
            path = Path(self.args.result_dir) / result_filename(self.label, concurrency, rate)
            print(f"results: {write_result(path, result)}")
        return result

    async def _load_with_server_counters(self, load, stream, warmup_stream):
        """Run the load; read the server's speculative-decoding counters before and after."""
        from gossamer.bench.loadgen import run_load
        from gossamer.bench.server_metrics import scrape_spec_counters, spec_summary

        base, headers = self.client.base_url, self.client.headers
        before = await scrape_spec_counters(base, headers)
        outcome = await run_load(self.client, load, stream, warmup_stream)
        after = await scrape_spec_counters(base, headers)
        return outcome, spec_summary(before, after)

    def _load_config(self, concurrency: int | None, rate: float) -> LoadConfig:
        from gossamer.bench.loadgen import LoadConfig

        num_requests = self.args.num_prompts
        if num_requests is None and self.args.duration is None:
            num_requests = max(50, 10 * concurrency) if concurrency else 200
        return LoadConfig(
            concurrency=concurrency,
            request_rate=rate,
            burstiness=self.args.burstiness,
            num_requests=num_requests,
            duration_s=self.args.duration,
            num_warmup=self.args.warmup,
            seed=self.args.seed,
            show_progress=not self.args.no_progress,
        )

    def _config(self, load: LoadConfig, sweep_index: int) -> dict[str, Any]:
        """The full configuration of one run, without secrets (header values, API key)."""
        return {
            "base_url": self.client.base_url,
            "endpoint": self.client.endpoint,
            "model": self.client.model,
            "workload": dataclasses.asdict(self.spec),
            "tokenizer": self.args.tokenizer,
            "exact_prompt_lengths": self.builder.exact,
            "concurrency": load.concurrency,
            "request_rate": None if math.isinf(load.request_rate) else load.request_rate,
            "burstiness": load.burstiness,
            "num_prompts": load.num_requests,
            "duration_s": load.duration_s,
            "num_warmup": load.num_warmup,
            "seed": load.seed,
            "sweep_index": sweep_index,  # prompts come from seed "<seed>/run<sweep_index>"
            "percentiles": self.percentiles,
            "slo": dataclasses.asdict(self.slo) if self.slo else None,
            "ignore_eos": self.client.ignore_eos,
            "temperature": self.client.temperature,
            "extra_body": self.client.extra_body,
            "request_timeout_s": self.client.timeout_s,
            "header_names": sorted(self.client.headers),
            "cli_args": _public_args(self.args),
        }


async def probe_server(base_url: str, headers: dict[str, str]) -> dict[str, Any]:
    """What the server says about itself (models, version); best effort, never raises."""
    import httpx

    info: dict[str, Any] = {"base_url": base_url}
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            response = await http.get(f"{base_url}/v1/models", headers=headers)
            response.raise_for_status()
            models = response.json().get("data") or []
            info["models"] = [m.get("id") for m in models]
            if models:
                info["model"] = models[0].get("id")
                info["owned_by"] = models[0].get("owned_by")
            info["server_header"] = response.headers.get("server")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
        try:  # vLLM and SGLang answer GET /version
            response = await http.get(f"{base_url}/version", headers=headers)
            if response.status_code == 200:
                info["version"] = response.json()
        except (httpx.HTTPError, ValueError):
            pass
    return info


def _public_args(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options as given, without secrets (API key, header values)."""
    hidden = {"run", "api_key", "header"}
    return {k: v for k, v in vars(args).items() if k not in hidden}


def _workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        name=args.workload,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        dataset_path=args.dataset_path,
        sharegpt_output_len=args.sharegpt_output_len,
        prefix_groups=args.prefix_groups,
        prefix_questions=args.prefix_questions,
        prefix_len=args.prefix_len,
        turns=args.turns,
    )


def _sweep_points(args: argparse.Namespace) -> list[tuple[int | None, float]]:
    rates = _float_list(args.request_rate, "--request-rate")
    if args.concurrency:
        concurrencies = [_concurrency(c) for c in _float_list(args.concurrency, "--concurrency")]
    else:
        concurrencies = [None] if any(not math.isinf(r) for r in rates) else [1]
    if args.num_prompts is not None and args.duration is not None:
        raise BenchConfigError("give --num-prompts or --duration, not both")
    return [(c, r) for c in concurrencies for r in rates]


def _concurrency(value: float) -> int | None:
    if math.isinf(value):
        return None  # "inf": no limit (only meaningful with a finite --request-rate)
    if not value.is_integer() or value < 1:
        raise BenchConfigError(f"--concurrency takes whole numbers >= 1 or inf, got {value:g}")
    return int(value)


def _headers(args: argparse.Namespace) -> dict[str, str]:
    headers = {}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    for item in args.header:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BenchConfigError(f"bad --header {item!r}: use KEY=VALUE")
        headers[key.strip()] = value.strip()
    return headers


def _extra_body(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchConfigError(f"--extra-body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BenchConfigError("--extra-body must be a JSON object, e.g. '{\"top_p\": 0.9}'")
    return body


def _float_list(text: str, option: str) -> list[float]:
    try:
        values = [float(item) for item in str(text).split(",") if item.strip()]
    except ValueError:
        raise BenchConfigError(
            f"{option} takes numbers separated by commas, got {text!r}"
        ) from None
    if not values:
        raise BenchConfigError(f"{option} needs at least one value")
    return values


# ---- compare ----------------------------------------------------------------------------------


def _compare(args: argparse.Namespace) -> int:
    from gossamer.bench.report import compare_table, load_result

    results = [load_result(path) for path in args.results]
    print(compare_table(results))
    if not args.no_plots:
        from gossamer.bench.plots import write_plots

        for path in write_plots(results, args.out_dir):
            print(f"plot: {path}")
    return 0
