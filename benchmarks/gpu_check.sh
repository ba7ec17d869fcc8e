#!/bin/bash
# The lent-GPU session's one prepared script (replaces gpu_remeasure.sh): under 8 minutes on one H100 or H200.
#
#   bash benchmarks/gpu_check.sh OUTDIR            # OUTDIR, else $OUT, else ./gpu_check
#   DRY=1 bash benchmarks/gpu_check.sh OUTDIR      # every step tiny on the CPU: checks the script, measures nothing
#
# Steps, each under its own timeout (seconds in brackets; they sum to 480) so one slow step cannot eat the budget:
#   1. the CUDA tests: tests/test_cuda.py and the env's CUDA test                                     [250]
#   2. training throughput, paper preset, bf16, 1,024 and 4,096 envs (benchmarks/train_throughput.py)  [50]
#   3. the same at 4,096 envs with stage 1 on the shared window kernel instead of cuDNN's LSTM         [25]
#      (its input projection once per day-row; its bias gradient a row sum, not cuDNN's kernel)
#   4. the 10,000-episode run: paper preset, 4,096 envs, bf16, one GPU, timed                          [50]
#   5. one study cell alone: paper preset, example data, 24 episodes, --retrain none                   [30]
#   6. twelve such cells (seeds 1-12) trained as one batch in one process (--batch_cells 12)           [75]
# Limits from the H200 run at b54360f (wall s there): CUDA tests 148, throughput 44, shared kernel 23, 10,000
# episodes 47; at 100 episodes one cell 70 and the 12 cells 220. Since 1ff4098 the CUDA tests also train --seed 1-2
# with fp16 and with --compile (inductor over the stacked forward, never timed on a GPU: the K = 1 compile test took
# 67 s), so they get 250 s and the cells train 24 episodes each.
# then a summary table (summary.md). Every log lands in OUTDIR, with the studies' small files (study.md, cells.csv,
# each cell's status.json); checkpoints stay in a scratch folder ($TMPDIR or /tmp), out of OUTDIR. Assumes python3
# has torch with CUDA and the package's dependencies; run it from the repository root.
# The lent machine's image has torch, numpy, pandas, scipy, pyarrow, matplotlib and pytest but not gymnasium or
# python-dotenv: download them here (`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform any
# -d .whl gymnasium==1.4.0 farama-notifications==0.0.6 python-dotenv==1.2.2`, .whl ignored in .git/info/exclude),
# carry .whl, and begin the call with `python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
# && export PYTHONPATH=/tmp/site`. Only 8 files come back from $OUT: write to a scratch folder and tar it into $OUT.
set -u
out=${1:-${OUT:-gpu_check}}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
dry=${DRY:-0}
data=csv:examples/data/stocks_daily_6_ohlcv.csv
summary="$out/summary.md"

if [ "$dry" = 1 ]; then
    device=cpu; gpus=0; envs=4; big_envs=8; tenk_envs=8; tenk_batch=128; tenk_episodes=16; cell_episodes=8
    net=(--window 5 --stage1_hidden 8 --feature_dim 8 --stage2_hidden 16 --n_steps 16 --batch_size 32 --epochs 1
         --episode_length 16 --num_envs 4)
    where=(--cpu --threads 1)
    precision=none
else
    device=cuda; gpus=1; envs=1024; big_envs=4096; tenk_envs=4096; tenk_batch=131072; tenk_episodes=10000
    cell_episodes=24; net=(); where=(--cells_per_gpu 1); precision=bf16
fi

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU (dry run)"
    python3 -c "import torch; print('torch', torch.__version__, '| cuda', torch.cuda.is_available())"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null)"
} | tee "$out/machine.txt"

rows=()
step() {  # step NAME TIMEOUT_S LOG COMMAND...: run one step under its timeout, note its status and seconds
    local name=$1 limit=$2 log=$3
    shift 3
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$log" 2>&1
    local code=$?
    local status=ok
    [ "$code" = 124 ] && status="timed out (${limit} s)"
    [ "$code" != 0 ] && [ "$code" != 124 ] && status="failed ($code)"
    rows+=("| $name | $status | $((SECONDS - start)) | $log |")
    echo "[gpu_check] $name: $status in $((SECONDS - start)) s"
}

step "CUDA tests" 250 pytest_cuda.log \
    python3 -m pytest -q -p no:cacheprovider -n 0 -m cuda tests/test_cuda.py "tests/test_env.py::test_cuda_matches_cpu"

step "throughput, paper, $precision, $envs and $big_envs envs" 50 throughput.log \
    python3 benchmarks/train_throughput.py --preset paper --device "$device" --num_envs "$envs,$big_envs" \
    --minibatches 4 --mixed_precision "$precision" --updates 2 --timeout 30 --threads 1 --json "$out/throughput.json"

step "throughput, paper, $precision, $big_envs envs, shared window kernel" 25 throughput_shared.log \
    python3 benchmarks/train_throughput.py --preset paper --device "$device" --num_envs "$big_envs" \
    --minibatches 4 --mixed_precision "$precision" --updates 1 --timeout 30 --threads 1 --window_kernels shared \
    --json "$out/throughput_shared.json"

step "$tenk_episodes episodes, paper, $tenk_envs envs, $precision" 50 tenk.log \
    /usr/bin/time -f "wall %e s, max RSS %M KiB" python3 train_distributed_clstm_ppo.py --preset paper \
    --num_gpus "$gpus" --num_envs "$tenk_envs" --batch_size "$tenk_batch" --mixed_precision "$precision" \
    --num_episodes "$tenk_episodes" --eval_every 1000 --checkpoint_dir "$work/tenk" --run_name tenk --no-progress \
    ${net[@]+"${net[@]}"}

study=(python3 -m clstm_ppo.cli study --data "$data" --preset paper --policies clstm --num_episodes "$cell_episodes"
       --retrain none --trade_start 2023-01-03 --workers 1 --bootstrap 100 --ledger "$out/ledger.jsonl"
       "${where[@]}" ${net[@]+"${net[@]}"})
step "1 cell alone, $cell_episodes episodes" 30 study_1.log "${study[@]}" --out "$work/study_1" --seeds 1 --batch_cells 1
step "12 cells as one batch, $cell_episodes episodes each" 75 study_12.log \
    "${study[@]}" --out "$work/study_12" --seeds 1-12 --batch_cells 12
for n in 1 12; do  # the studies' small files
    (cd "$work" && find "study_$n" \( -name study.md -o -name cells.csv -o -name status.json \) -print0 \
        | xargs -0 -r cp --parents -t "$out")
done

{
    echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ) $([ "$dry" = 1 ] && echo '(DRY: tiny CPU run, no measurement)')"
    echo
    sed 's/^/    /' "$out/machine.txt"
    echo
    echo "| step | status | wall s | log |"
    echo "|---|---|---:|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Throughput (env steps/s):"
    grep -E '^\|' "$out/throughput.log" | head -8
    echo
    echo "Shared window kernel (stage 1) at $big_envs envs (its rollout runs it on dense windows too: compare forward and backward s):"
    grep -E '^\|' "$out/throughput_shared.log" | head -4
    echo
    echo "10,000 episodes: $(grep -E 'done:|wall ' "$out/tenk.log" | tr '\n' ' ')"
    for n in 1 12; do
        secs=$(python3 -c "
import json, pathlib
rows = [json.loads(p.read_text()) for p in pathlib.Path('$out/study_$n/cells').glob('*/status.json')]
done = [r for r in rows if r.get('status') == 'done']
print(f'{len(done)}/{len(rows)} cells done; training {max((r[\"train_seconds\"] for r in done), default=float(\"nan\")):.1f} s, cell process {max((r[\"seconds\"] for r in done), default=float(\"nan\")):.1f} s')
" 2>/dev/null)
        echo "study of $n cell(s): $secs"
    done
} | tee "$summary"
