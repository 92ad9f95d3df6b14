"""benchmarks/spec_decode.py e2e: the warm-up's prompts must not be the timed run's.

Identical prompts once made the timed run's first step a prefix-cache hit that left a 5-token
prompt tail: a shape the warm-up never ran, whose kernels Triton compiled inside the timed window
(~1 s on the first row, the batch-1 baseline without speculation)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

from gossamer.harmony.render import render_chat
from gossamer.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "gossamer" / "models" / "gpt-oss-mini"
DECODE_LAUNCH_MAX_QUERY = 8  # gossamer/kernels/attention.py DECODE_MAX_QUERY_LEN (no triton here)


def spec_decode_module():
    path = ROOT / "benchmarks" / "spec_decode.py"
    spec = importlib.util.spec_from_file_location("spec_decode_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def common_prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_warm_up_and_timed_chat_prompts_share_only_the_template_header():
    bench = spec_decode_module()
    loaded = SimpleNamespace(checkpoint=MINI, config=None)
    tokenizer = Tokenizer.from_file(MINI)
    header = common_prefix(
        *(
            render_chat(tokenizer, [{"role": "user", "content": text}], reasoning_effort="low")
            for text in ("a", "b")
        )
    )
    for batch in (1, 8):
        warm_up = bench.workload(loaded, batch, seed=1000 + batch)
        timed = bench.workload(loaded, batch, seed=batch)
        for prompt in timed:
            shared = max(common_prefix(prompt, other) for other in warm_up)
            # a few tokens of the seed tag may match; never a whole prompt tail's worth
            assert shared - header < DECODE_LAUNCH_MAX_QUERY, (batch, shared, header)
            assert len(prompt) - shared > DECODE_LAUNCH_MAX_QUERY
