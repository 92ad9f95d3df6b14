"""Decode speed of gpt-oss-120b / gpt-oss-20b on one GPU with dummy weights, beside the physical floor.

    python benchmarks/decode_speed.py                       # 120b and 20b, the full table
    python benchmarks/decode_speed.py --models gpt-oss-20b --batch-sizes 1 --contexts 1024

For each model: time to first token of a 1k prompt (a real prefill), batch-1 decode tok/s at each
context, and decode-step throughput at larger batches (their contexts are filled with random KV
rather than prefilled, which costs the same to read). Each decode row is timed twice: `decode` with
a host round trip per step (tokens to the host and back), `fed` with each step's token fed on the
device, as the overlapped engine feeds it. Each row carries its floor: the bytes one step must read
(weights actually touched + KV) over the device-to-device copy bandwidth measured in the same run.
Results go to stdout as a table and to --json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from timing import copy_bandwidth

from gossamer.config import ModelConfig
from gossamer.engine.core import KV_CACHE_DTYPES, kv_cache_dtype
from gossamer.model import mxfp4
from gossamer.model.loader import load_model
from gossamer.runner.model_runner import ModelRunner, SeqInput

BLOCK = 16
MAX_KV_TOKENS = 64 * 8192  # skip batch x context combinations whose KV would not fit beside 120b


@dataclass
class Row:
    model: str
    kind: str  # decode (a host round trip per step) | fed (tokens fed on the device) | ttft
    batch: int
    context: int
    ms_per_step: float
    tokens_per_s: float
    floor_ms: float
    bytes_per_step: float

    def line(self) -> str:
        pct = 100 * self.floor_ms / self.ms_per_step if self.ms_per_step else 0
        return (
            f"{self.model:13s} {self.kind:6s} {self.batch:5d} {self.context:6d} "
            f"{self.ms_per_step:9.3f} {self.tokens_per_s:10.1f} {self.floor_ms:8.3f} {pct:5.0f}%"
        )


def step_bytes(cfg: ModelConfig, batch: int, context: int, kv_bytes_per_elem: int = 2) -> float:
    """Bytes one decode step must read: dense weights, the experts the batch touches, the KV."""
    hidden, inter, experts = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    attn = hidden * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * hidden
    router = hidden * experts
    per_layer_dense = 2 * (attn + router)
    expert_bytes = (2 * inter * hidden + hidden * inter) * (0.5 + 1 / 32)  # e2m1 + e8m0 scales
    # expected distinct experts when `batch` tokens each pick top-k of E uniformly
    touched = experts * (1 - (1 - cfg.num_experts_per_tok / experts) ** batch)
    unembed = 2 * cfg.vocab_size * hidden
    kv = 0
    for layer in range(cfg.num_hidden_layers):
        seen = min(context, cfg.sliding_window) if cfg.is_sliding(layer) else context
        kv += 2 * seen * cfg.kv_size * kv_bytes_per_elem * batch
    return cfg.num_hidden_layers * (per_layer_dense + touched * expert_bytes) + unembed + kv


def make_seqs(batch: int, context: int, blocks_per_seq: int) -> list[SeqInput]:
    seqs = []
    for b in range(batch):
        base = 1 + 2 * b * blocks_per_seq
        full = list(range(base, base + blocks_per_seq))
        sliding = list(range(base + blocks_per_seq, base + 2 * blocks_per_seq))
        seqs.append(SeqInput([1], context, (full, sliding)))
    return seqs


def timed_decode(runner: ModelRunner, seqs: list[SeqInput], steps: int) -> float:
    """Seconds per decode step, the host loop included (inputs, replay, greedy pick, feed back)."""
    for _ in range(3):
        runner.run(seqs).argmax(-1).tolist()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        tokens = runner.run(seqs).argmax(-1).tolist()
        for seq, token in zip(seqs, tokens, strict=True):
            seq.token_ids = [token]
            seq.start += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def fed_step(runner: ModelRunner, seqs: list[SeqInput], ids: torch.Tensor | None) -> torch.Tensor:
    """One step fed `ids` on the device; returns its greedy picks, as the overlapped engine takes
    them (engine/overlap.py sample_on_device): the graph's own where it made them
    (ModelRunner.last_greedy, which the next step then reads in place), else an argmax."""
    logits = runner.run(seqs, device_input_ids=ids)
    return runner.last_greedy if runner.last_greedy is not None else logits.argmax(-1)


def timed_decode_fed(runner: ModelRunner, seqs: list[SeqInput], steps: int) -> float:
    """Seconds per decode step when each step's input token is the previous step's greedy pick,
    fed on the device (`ModelRunner.run(device_input_ids=...)`), and the host waits only at the
    end: how the overlapped engine runs plain decode steps (engine/overlap.py), so the GPU never
    idles for the host's round trip. The host still fills positions and slots every step. The
    picks are the graph's own where it makes them (ModelRunner.last_greedy), which the runner
    then reads in place, as in the engine."""
    ids = None
    for step in range(3 + steps):
        if step == 3:
            torch.cuda.synchronize()
            start = time.perf_counter()
        ids = fed_step(runner, seqs, ids)
        for seq in seqs:
            seq.start += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def bench_model(name: str, args: argparse.Namespace, bandwidth: float) -> list[Row]:
    max_context = max(args.contexts) + args.steps + 16
    loaded = load_model(
        name, load_format="dummy", device="cuda", ops=args.ops, max_model_len=max_context
    )
    model, cfg = loaded.model, loaded.config
    rows: list[Row] = []
    blocks_per_seq = math.ceil(max_context / BLOCK)
    biggest = max(args.batch_sizes)
    combos = [(b, c) for c in args.contexts for b in args.batch_sizes if b * c <= MAX_KV_TOKENS]
    started = time.perf_counter()
    runner = ModelRunner(
        model,
        num_blocks=1 + 2 * max(b * math.ceil((c + args.steps + 16) / BLOCK) for b, c in combos),
        block_size=BLOCK,
        max_num_seqs=biggest,
        max_num_batched_tokens=max(args.prompt_len, biggest),
        cuda_graphs=not args.no_cuda_graphs,
        graph_sizes=tuple(args.batch_sizes),
        warmup=not args.no_warmup,
        kv_cache_dtype=kv_cache_dtype(args.kv_cache_dtype, model.dtype, model.device),
    )
    print(
        f"{name}: runner start-up (kernel warm-up, graph capture) {time.perf_counter() - started:.1f} s"
    )
    fill_random(runner.kv_cache)  # random KV: reading it costs what a real context costs
    kv_bytes = runner.kv_cache.element_size()
    first_token = time_to_first_token(name, runner, args.prompt_len, blocks_per_seq, cfg, bandwidth)
    rows.append(first_token)
    for batch, context in combos:
        nbytes = step_bytes(cfg, batch, context + args.steps // 2, kv_bytes)
        timers = {"decode": timed_decode, "fed": timed_decode_fed}
        for kind, timer in timers.items():
            seqs = make_seqs(batch, context, math.ceil((context + args.steps + 16) / BLOCK))
            seconds = timer(runner, seqs, args.steps)
            floor_ms = 1e3 * nbytes / bandwidth
            rows.append(
                Row(name, kind, batch, context, 1e3 * seconds, batch / seconds, floor_ms, nbytes)
            )
            print(rows[-1].line(), flush=True)
    del runner, model, loaded
    torch.cuda.empty_cache()
    return rows


def fill_random(kv_cache: torch.Tensor) -> None:
    """N(0, 0.5) keys and values, one layer slice at a time (fp8 has no normal_: drawn in bf16)."""
    for layer in kv_cache:
        layer.copy_(
            torch.empty(layer.shape, dtype=torch.bfloat16, device=layer.device).normal_(0, 0.5)
        )


def time_to_first_token(
    name: str, runner: ModelRunner, prompt_len: int, blocks_per_seq: int, cfg, bandwidth: float
) -> Row:
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,)).tolist()
    seq = make_seqs(1, 0, blocks_per_seq)[0]
    seq.token_ids = prompt
    for _ in range(2):
        runner.run([seq]).argmax(-1).tolist()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        runner.run([seq]).argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[2]
    floor = step_bytes(cfg, prompt_len, prompt_len) / bandwidth
    row = Row(name, "ttft", 1, prompt_len, 1e3 * seconds, prompt_len / seconds, 1e3 * floor, 0)
    print(row.line(), flush=True)
    return row


def transformers_decode(steps: int = 16) -> dict:
    """transformers' eager GptOss on the 20b shapes (bf16, dense experts), batch 1: tok/s."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(num_hidden_layers=24, num_local_experts=32)
    with torch.device("meta"):
        model = GptOssForCausalLM(config)
    model = model.to_empty(device="cuda").to(torch.bfloat16)
    for param in model.parameters():
        param.data.normal_(0, 0.02)
    model.eval()
    ids = torch.randint(0, config.vocab_size, (1, 1024), device="cuda")
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return {
        "model": "transformers gpt-oss-20b shapes (bf16 eager)",
        "tokens": out.shape[1] - 1024,
        "seconds_incl_1k_prefill": seconds,
        "tokens_per_s": steps / seconds,
    }


def apply_tuning(args: argparse.Namespace) -> dict:
    """Configs from this run's sweeps (benchmarks/tuning.py), printed and kept in the JSON."""
    from tuning import apply_gemv_sweep, apply_grouped_sweep, apply_moe_sweep

    tuned = {}
    if args.moe_sweep:
        tuned["moe"] = apply_moe_sweep(args.moe_sweep)
    if args.grouped_sweep:
        tuned["grouped"] = apply_grouped_sweep(args.grouped_sweep)
    if args.gemv_sweep:
        tuned["gemv"] = apply_gemv_sweep(args.gemv_sweep)
    if tuned:
        print(f"tuned: {json.dumps(tuned)}")
    return tuned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="gpt-oss-120b,gpt-oss-20b")
    parser.add_argument("--contexts", default="1024,8192")
    parser.add_argument("--batch-sizes", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--ops", default="auto")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES])
    parser.add_argument("--transformers", action="store_true", help="also time transformers")
    parser.add_argument(
        "--moe-decode",
        choices=("default", "fp32", "fp16"),
        default="default",
        help="which MXFP4 GEMV serves T*top_k <= 32 (gossamer/kernels/moe_mxfp4.py)",
    )
    parser.add_argument(
        "--moe-max-pairs",
        type=int,
        default=None,
        help="override DECODE_MAX_PAIRS (GEMV vs grouped)",
    )
    parser.add_argument(
        "--grouped-ptx",
        choices=("default", "on", "off"),
        default="default",
        help="the grouped MoE kernels' inline-PTX bf16 lanes (GROUPED_INLINE_PTX)",
    )
    parser.add_argument(
        "--grouped",
        choices=("default", "v1", "v2"),
        default="default",
        help="which grouped MoE kernels serve MXFP4 batches above the GEMV limit (GROUPED_V2)",
    )
    parser.add_argument(
        "--no-warmup", action="store_true", help="skip the runner's start-up kernel warm-up"
    )
    parser.add_argument(
        "--pdl",
        choices=("default", "on", "off"),
        default="default",
        help="programmatic dependent launch of the Triton kernels (gossamer/kernels/pdl.py)",
    )
    parser.add_argument(
        "--attention-merge",
        choices=("default", "in-kernel", "separate"),
        default="default",
        help="flash-decoding splits merged by the attention kernel or a second launch",
    )
    parser.add_argument(
        "--gemv-prefetch",
        type=int,
        default=None,
        help="W tiles per program the Triton GEMV sends to L2 before its PDL wait",
    )
    parser.add_argument(
        "--moe-layout",
        choices=("default", *mxfp4.LAYOUTS),
        default="default",
        help="MXFP4 bit layout on the GPU: as published, or repacked at load (model/mxfp4.py)",
    )
    parser.add_argument(
        "--fuse-rope",
        choices=("default", "on", "off"),
        default="default",
        help="RoPE and the KV write inside pure-decode attention, or their own launch",
    )
    parser.add_argument(
        "--grouped-gemv-max-pairs",
        type=int,
        default=None,
        help="(token, expert) pairs up to which the expert-grouped fp16 GEMV serves the MoE",
    )
    parser.add_argument("--moe-sweep", help="moe_decode_sweep.py JSON: use its best configs")
    parser.add_argument(
        "--grouped-sweep", help="moe_grouped_sweep.py JSON: use its best grouped v2 configs"
    )
    parser.add_argument("--gemv-sweep", help="gemv_sweep.py JSON: use its best configs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    tuned = apply_tuning(args)
    from gossamer.kernels import attention, gemv, moe_mxfp4, pdl

    if args.moe_decode != "default":
        moe_mxfp4.DECODE_FP16 = args.moe_decode == "fp16"
    if args.moe_max_pairs is not None:
        moe_mxfp4.DECODE_MAX_PAIRS = args.moe_max_pairs
    if args.grouped_ptx != "default":
        moe_mxfp4.GROUPED_INLINE_PTX = args.grouped_ptx == "on"
    if args.grouped != "default":
        moe_mxfp4.GROUPED_V2 = args.grouped == "v2"
    if args.pdl != "default":
        pdl.ENABLED = args.pdl == "on"
    if args.attention_merge != "default":
        attention.MERGE_IN_KERNEL = args.attention_merge == "in-kernel"
    if args.grouped_gemv_max_pairs is not None:
        moe_mxfp4.GROUPED_GEMV_MAX_PAIRS = args.grouped_gemv_max_pairs
    if args.fuse_rope != "default":
        attention.FUSE_ROPE_KV = args.fuse_rope == "on"
    if args.moe_layout != "default":  # read by mxfp4.gpu_layout() as the model loads
        os.environ["GOSSAMER_MXFP4_LAYOUT"] = args.moe_layout
    if args.gemv_prefetch is not None:
        gemv.CONFIGS = {k: replace(c, prefetch=args.gemv_prefetch) for k, c in gemv.CONFIGS.items()}
    args.contexts = [int(c) for c in args.contexts.split(",")]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    bandwidth = copy_bandwidth(gib=4)
    print(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s")
    print("model         kind   batch    ctx   ms/step      tok/s  floor_ms  %floor")
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name, args, bandwidth)
    reference = transformers_decode() if args.transformers else None
    if reference:
        print(f"transformers (20b shapes, bf16 eager): {reference['tokens_per_s']:.1f} tok/s")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "copy_bandwidth_bytes_per_s": bandwidth,
        "args": {k: v for k, v in vars(args).items()},
        "rows": [asdict(r) for r in rows],
        "transformers": reference,
        "tuned": tuned,
    }
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
