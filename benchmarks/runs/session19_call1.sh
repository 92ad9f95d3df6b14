#!/usr/bin/env bash
# Prepared in session 17 (its call 3 was refused: no machine lent; session 18 was lent none and
# added context_graphs). #8, ~9.5 min (steps capped at 580 s: results are saved after each step).
# The step's
# greedy pick inside the graph (model_runner.GREEDY_IN_GRAPH, off; GOSSAMER_GREEDY_IN_GRAPH=1): at
# batch 1 the unembedding GEMV's programs pick the argmax with one atomic max each, and the next
# step's embedding (kernels/embed.py) reads that pick in place, so the argmax kernel (+ its
# memset), the copy of the pick into the input buffer and torch's embedding kernel leave the step.
# Session 17's timeline put 31 us between the unembedding's end and the next step's first norm
# (20b); 20b needs about -20 us for 700 tok/s.
# (1) GPU tests with the pick on (the env reaches every runner): the pick itself (eager, graph
#     replays, ties), the embedding, the bf16 model and its graphs, the overlapped engine against
#     the synchronous one, tree graphs, the runner's in-place feed; gate_up's SCALES_T (120b);
# (2) 20b: defaults against greedy_in_graph, gate_up_scales_t (session 18: the batch-1 gate_up
#     GEMV moved both accumulators through shared memory every step, 4 barriers a step; its
#     scales loaded through transposed pointers take the group sums' layout, offline 337 -> 328
#     instructions a loop and no barriers), graph_131k (the graph captured for a 131k
#     context as `gossamer serve` captures it: 64 attention key splits at batch 1, not the
#     benchmark's 16) and context_graphs (graph_131k plus session 18's context-bucket graphs,
#     model_runner.CONTEXT_GRAPHS: the 1k step replays a graph of 16 splits);
# (3) 120b: the same four. Session 19 added advance_in_graph (the pick, and the graph moving its
# own inputs on so that the fed step uploads nothing: model_runner.ADVANCE_IN_GRAPH) to both A/Bs
# and its tests to (1), and moved the 20b timeline out (device time).
# If greedy_in_graph wins on both: turn GREEDY_IN_GRAPH on (then greedy_argmax is the old path).
# If gate_up_scales_t wins on both: SCALES_T 1 in DECODE_FP16_GATE_UP.
# If graph_131k is slower than the defaults and context_graphs wins that back: turn CONTEXT_GRAPHS
# on (the server's graphs are captured at 131k). Then session19_call2.sh.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s19c1; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; local rc=$?; echo "exit $rc" >> "$R/$name.log"; tail -n ${TAILN:-14} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s19c1; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $R/gpu.txt
TAILN=12 step gpu_tests 180 env GOSSAMER_GREEDY_IN_GRAPH=1 GOSSAMER_ADVANCE_IN_GRAPH=1 bash -c 'python3 -m pytest tests/kernels/test_gemv.py -k "greedy or logits or unembedding or advance" -p no:cacheprovider -q --tb=short -rf; a=$?; python3 -m pytest tests/kernels/test_moe_mxfp4.py -m gpu -k scales_t -p no:cacheprovider -q --tb=short -rf; a=$((a || $?)); python3 -m pytest tests/kernels/test_embed.py tests/kernels/test_triton_model.py tests/engine/test_async_scheduling_gpu.py tests/spec/test_tree_graphs_gpu.py tests/runner/test_device_input_ids.py tests/runner/test_advance_in_graph_gpu.py -p no:cacheprovider -q --tb=short -rf; exit $((a || $?))'
TAILN=10 step ab_20b 175 python3 benchmarks/fusion_ab.py --models gpt-oss-20b --variants defaults,greedy_in_graph,advance_in_graph,gate_up_scales_t,graph_131k,context_graphs --interleave --fed --rounds 5 --steps 32 --json $R/ab_20b.json
TAILN=10 step ab_120b 195 python3 benchmarks/fusion_ab.py --models gpt-oss-120b --variants defaults,greedy_in_graph,advance_in_graph,gate_up_scales_t,graph_131k,context_graphs --interleave --fed --rounds 5 --steps 32 --json $R/ab_120b.json
