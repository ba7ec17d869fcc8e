#!/bin/bash
# One lent-GPU session's re-measurement (issue 16 step 1), written so it can be re-run as is:
#   bash benchmarks/gpu_remeasure.sh OUTDIR
# Runs the CUDA tests, the training throughput sweep (fused and shared window kernels, bf16, 1,024 /
# 4,096 / 16,384 envs), MFU, ours-vs-sb3 on the GPU and the wall time of the mission's 10,000 episodes.
# Every log lands in OUTDIR. Assumes python3 has torch with CUDA and the package's dependencies.
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$out/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$out/gpu.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py "tests/test_env.py::test_cuda_matches_cpu" \
    2>&1 | tail -25 | tee "$out/pytest_cuda.log"
timeout 300 python3 benchmarks/train_throughput.py --preset paper --device cuda --num_envs 1024,4096,16384 --minibatches 4 \
    --mixed_precision bf16 --window_kernels fused,shared --updates 2 --timeout 100 --json "$out/throughput.json" \
    2>&1 | tee "$out/throughput.log"
timeout 90 python3 benchmarks/mfu.py --device cuda --policies clstm --num_envs 4096 --minibatches 4 \
    --mixed_precision bf16 --window_kernel shared 2>&1 | tee "$out/mfu.log"
timeout 150 python3 benchmarks/vs_sb3.py --threads 8 --device cuda --our_envs 1024 --our_minibatches 4 \
    --sb3_steps 1024 2>&1 | tee "$out/vs_sb3.log"
# The mission's number: 10,000 episodes of 252 days, paper preset, bf16, 4,096 envs on one GPU.
/usr/bin/time -f "wall %e s, max RSS %M KiB" timeout 240 python3 train_distributed_clstm_ppo.py --preset paper \
    --num_gpus 1 --num_envs 4096 --batch_size 131072 --mixed_precision bf16 --num_episodes 10000 \
    --eval_every 1000 --checkpoint_dir /tmp/ckpt_10k --run_name tenk --no-progress 2>&1 | tail -8 | tee "$out/tenk.log"
