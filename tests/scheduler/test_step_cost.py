"""CPU cost of a scheduler step: the engine's budget is < 1 ms per step at 64 requests including
the runner's input preparation, so schedule() + update() must stay well below that."""

from __future__ import annotations

import time

from gossamer.cache import KVCacheLayout, KVCacheManager
from gossamer.presets import preset
from gossamer.scheduler import Request, Scheduler
from tests.scheduler.fake_model import Params


def test_decode_step_cost_at_64_requests():
    layout = KVCacheLayout.from_model_config(preset("gpt-oss-120b"))
    manager = KVCacheManager.from_layout(layout, 20_000, block_size=16)
    scheduler = Scheduler(manager, max_num_batched_tokens=8192, max_num_seqs=256)
    for i in range(64):
        prompt = [(i * 7 + j) % 1000 for j in range(300)]
        scheduler.add_request(Request(f"r{i}", prompt, Params(max_tokens=10_000, ignore_eos=True)))
    while scheduler.waiting or any(
        r.num_tokens - r.num_computed_tokens > 1 for r in scheduler.running
    ):
        output = scheduler.schedule()
        scheduler.update(
            output, {s.request_id: [1] for s in output.scheduled_requests if s.do_sample}
        )
    num_steps = 300
    best = float("inf")
    for _ in range(3):  # best of three: the test machine is shared
        started = time.perf_counter()
        for step in range(num_steps):
            output = scheduler.schedule()
            assert len(output.scheduled_requests) == 64 == output.num_decode_requests
            scheduler.update(output, {s.request_id: [step] for s in output.scheduled_requests})
        best = min(best, (time.perf_counter() - started) / num_steps)
    # About 0.2 ms on a loaded 2-core CI box; the bound leaves room for noise, not for O(n^2).
    assert best < 1.0e-3, f"schedule + update took {best * 1e6:.0f} us per step"
    sliding = manager.num_held_blocks("r0")[1]
    assert sliding <= 128 // 16 + 1
