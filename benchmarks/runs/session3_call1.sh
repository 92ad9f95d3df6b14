#!/usr/bin/env bash
# Session 3 first device call: the unmeasured work from NOTES.md, then the per-kernel profile.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
R=/tmp/s3; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; echo "=== $name $(date +%T)"; timeout "$limit" "$@" > "$R/$name.log" 2>&1; echo "exit $?" >> "$R/$name.log"; tail -n ${TAILN:-25} "$R/$name.log"; tar czf "$OUT/results.tgz" -C /tmp s3; }
python3 -c "import torch, triton, transformers, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"
TAILN=15 step gpu_tests 150 python3 -m pytest tests/kernels/test_moe_mxfp4.py tests/kernels/test_attention.py tests/spec/test_spec_gpu.py -m gpu -q -p no:cacheprovider -x
step moe_sweep 100 python3 benchmarks/moe_decode_sweep.py --json $R/moe_sweep.json
step decode 140 python3 benchmarks/decode_speed.py --models gpt-oss-120b,gpt-oss-20b --contexts 1024 --batch-sizes 1,64 --steps 32 --moe-sweep $R/moe_sweep.json --json $R/decode.json
step decode_v2 70 python3 benchmarks/decode_speed.py --models gpt-oss-120b --contexts 1024 --batch-sizes 64,256 --steps 16 --grouped-v2 --moe-sweep $R/moe_sweep.json --json $R/decode_v2.json
step profile 100 python3 benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --top 40 --json $R/profile.json
