#!/usr/bin/env bash
# Session 21, call 6: where the H100's KV budget went (call 5: 1.33 GiB by default beside 120b's
# 60.77 GiB of weights). As throughput.py does: the copy-bandwidth probe, then 120b's dummy
# weights; then the driver's free memory, torch's reserved and allocated bytes, and the default
# budget (engine.core.kv_cache_bytes, which now counts the allocator's unused cache as free).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/benchmarks
mkdir -p $OUT/s21c7
timeout 150 python3 - <<'PY' 2>&1 | grep -v "warming up" | tee $OUT/s21c7/kv_budget.log
import logging, torch
from timing import copy_bandwidth
from throughput import load_dummy
from gossamer.engine.core import kv_cache_bytes, GiB
logging.basicConfig(level=logging.INFO)
print("copy", copy_bandwidth() / 1e12, "TB/s")
loaded = load_dummy("gpt-oss-120b", 2048)  # kept alive, as the engine keeps it
free, total = torch.cuda.mem_get_info()
print(f"free {free / GiB:.2f} total {total / GiB:.2f} reserved {torch.cuda.memory_reserved() / GiB:.2f} "
      f"allocated {torch.cuda.memory_allocated() / GiB:.2f} GiB")
print(f"default budget {kv_cache_bytes(torch.device('cuda'), 0.9) / GiB:.2f} GiB")
PY
