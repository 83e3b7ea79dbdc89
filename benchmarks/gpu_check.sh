#!/usr/bin/env bash
# fastrl's GPU checks in one pass, for a machine with one CUDA GPU that may reach no
# package registry: the GPU tests, fastrl against Sample Factory 2.1.1 on doom_battle
# and doom_defend_the_center with both sides' learner and inference on the GPU, the
# planner's own layout there, the model's costs in fp32 and bf16 on the GPU, and the
# bench's account of where the GPU's and the processes' time goes.
#
#   OUT=/tmp/gpu_check bash benchmarks/gpu_check.sh [STEP...]
#
# Steps, in this order, all by default: tests precision bench battle planned dtc;
# `layouts` (the policy workers' count and batching, on the bench), `compile` (the
# learner's step compiled), `compile_stall` (a run's rate while it compiles) and
# `mujoco` (Hopper-v5's learning, GPU against CPU) only when named.
# SECONDS_PER_RUN (60), SKIP (half of it), ROUNDS (1), WORKERS (the cores), ENVS (8)
# and FASTRL_LAYOUT (fixed) set the comparisons (Sample Factory's rate moved by a
# third between two one-round calls on one machine: two rounds say more; at 16 x 16
# its engines stepped their first frames 36-44 s after launch on a 16-core GPU
# machine, so a steady window needs runs of 120 s or more, which one 15-minute lease
# holds for one scenario); FASTRL_EXTRA adds
# fastrl.train options to fastrl's side alone (say "--num_workers 15
# --num_envs_per_worker 32 --num_policy_workers 1" against SF at WORKERS x ENVS).
#
# Wheels: where the machine has no registry, carry them in .whl/fastrl (vizdoom 1.3.2,
# faster-fifo 1.5.2, gymnasium 1.x, setproctitle, cloudpickle, farama-notifications) and
# .whl/sf (sample-factory 2.1.1, numpy<2, gymnasium<1, tensorboardx, colorlog,
# signal-slot-mp<2), fetched with `pip download --only-binary=:all: --platform ...`
# for the machine's Python (../shared/tools/gpu-wheels.sh all); `python
# benchmarks/slim_sf_wheel.py .whl/sf/sample_factory-*.whl` then lets both sets travel
# in one call. Sample Factory pins numpy<2 and gymnasium<1, fastrl wants
# gymnasium 1.x: each set goes into its own folder, and SF's interpreter is a
# two-line wrapper that puts its folder first. The `mujoco` step needs .whl/mujoco too
# (mujoco and mujoco-core at this machine's version, glfw, pyopengl: ~13 MB), which
# fits one call beside .whl/fastrl but not beside .whl/sf as well. Where .whl/ is
# absent the packages must be installed already (and --sf_venv given to
# vs_sample_factory.py instead).
#
# Every step runs under its own time limit and writes its log to $OUT, so a step
# that fails or hangs costs its limit and no more. Each step's exit code and the
# lines that matter are printed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastrl_gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
# The comparisons' records (benchmarks/records.py) come back with the logs; append
# them to benchmarks/results/ by hand: this copy of the repository is thrown away.
export FASTRL_BENCHMARK_RESULTS=${FASTRL_BENCHMARK_RESULTS:-$OUT/results}
PY=${PYTHON:-python3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-60}
WORKERS=${WORKERS:-$(( $(nproc) ))}

step() {  # step NAME LIMIT_S COMMAND...: run it, log to $OUT/NAME.log, report its exit code
    local name=$1 limit=$2; shift 2
    echo "=== $(date +%T) $name (limit ${limit} s)"
    timeout -k 15 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $(date +%T) $name exit $rc"
    return 0
}

{
    date -u; nproc; lscpu | grep -E "^Model name|^CPU family|^Model:"; free -g | head -2; nvidia-smi -L
    "$PY" -c "import torch, sys; print(sys.version); print(torch.__version__, torch.cuda.get_device_name(0))"
} >"$OUT/machine.log" 2>&1
cat "$OUT/machine.log"

if [ -d .whl/fastrl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fastrl-site .whl/fastrl/*.whl
    export PYTHONPATH=/tmp/fastrl-site:$PWD
fi
# MuJoCo for the `mujoco` step (mujoco, mujoco-core, glfw, pyopengl), beside fastrl's set.
if [ -d .whl/mujoco ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fastrl-site .whl/mujoco/*.whl
fi
SF_VENV=/tmp/sf-wrapper
if [ -d .whl/sf ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/sf-site .whl/sf/*.whl
    mkdir -p $SF_VENV/bin
    printf '#!/bin/sh\nPYTHONPATH=/tmp/sf-site:/tmp/fastrl-site exec %s "$@"\n' "$(command -v "$PY")" >$SF_VENV/bin/python
    chmod +x $SF_VENV/bin/python
fi
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")

STEPS=${*:-tests precision bench battle planned dtc}
wants() { [[ " $STEPS " == *" $1 "* ]]; }
# FASTRL_LAYOUT=planned lets fastrl's planner choose its layout against SF's (WORKERS x ENVS).
VS=(benchmarks/vs_sample_factory.py --device cuda --rounds "${ROUNDS:-1}" --seconds "$SECONDS_PER_RUN"
    --skip "${SKIP:-$(( SECONDS_PER_RUN / 2 ))}"
    --num_workers "$WORKERS" --num_envs_per_worker "${ENVS:-8}" --fastrl_inference policy_worker
    --fastrl_layout "${FASTRL_LAYOUT:-fixed}" --fastrl_extra "${FASTRL_EXTRA:-}"
    --venv $SF_VENV --sf_torch "torch==$TORCH_VERSION" --train_dir /tmp/vs_sf)
runs_tail() {  # each side's own log, whose tracebacks vs_sample_factory.py only flags
    for f in /tmp/vs_sf/fastrl_r1.log /tmp/vs_sf/sf_r1.log; do
        [ -f "$f" ] && { echo "--- tail of $f"; tail -n 30 "$f"; } >>"$OUT/$1.log"
    done
}

# The GPU tests (every test marked gpu; each skips with its reason without a GPU).
wants tests && step gpu_tests 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests

# The model on the GPU in fp32 and bf16: forward at the inference batch, learner step.
wants precision && step precision 120 bash -c "for p in fp32 bf16; do $PY -m fastrl.bench --env doom_battle \
    --mode infer --device cuda --precision \$p --seconds 5 --warmup 2 --with_wandb false; done"

# Where the time goes at the planned layout: the GPU's own share (learner's steps,
# policy workers' forwards, uploads, action copies) beside each process's host time.
wants bench && step bench 150 "$PY" -m fastrl.bench --env doom_battle --mode train --device cuda \
    --seconds 20 --warmup 30 --with_wandb false

# How the number of GPU policy workers (each its own CUDA context, time-sharing the
# GPU with the learner's) and their batching change the run, the rest of the layout
# left to the planner: the plan's own choice, then 1 and 2 policy workers, and 1 that
# waits 2 ms to gather a bigger batch, 1 beside a rollout worker on every other core
# (pw1full), 2 beside one on each of the other cores (pw2full), or those of
# LAYOUT_VARIANTS; on doom_battle and doom_defend_the_center (there not pw2 and
# pw1wait). The learner stays eager here: a compile would add
# ~45 s to each run and its CPU to the first half of it (the `compile` step times it).
if wants layouts; then
    for env in doom_battle doom_defend_the_center; do
        for variant in plan pw1 pw2 pw1wait pw1full pw2full; do
            case $variant in
                plan) extra=() ;; pw1) extra=(--num_policy_workers 1) ;; pw2) extra=(--num_policy_workers 2) ;;
                pw1wait) extra=(--num_policy_workers 1 --inference_batch_wait_ms 2) ;;
                pw1full) extra=(--num_policy_workers 1 --num_workers $(( WORKERS - 1 ))) ;;
                pw2full) extra=(--num_policy_workers 2 --num_workers $(( WORKERS - 2 ))) ;;
            esac
            [[ " ${LAYOUT_VARIANTS:-plan pw1 pw2 pw1wait pw1full pw2full} " == *" $variant "* ]] || continue
            [ "$env" = doom_defend_the_center ] && [ "$variant" = pw2 -o "$variant" = pw1wait ] && continue
            step "layout_${env#doom_}_$variant" 90 "$PY" -m fastrl.bench --env $env --mode train --device cuda \
                --seconds 15 --warmup 20 --with_wandb false --compile_learner off "${extra[@]}"
        done
    done
fi

# The learner's step compiled on the GPU at the planned layout. `auto` stays eager on
# a GPU (the compile stalled the learner for its 35 s, fastrl/learning/compiled.py);
# `on` compiles in the background and the bench reports the compiled step's time
# (20 ms per 1,024 samples on an H200, against eager's ~30-40).
wants compile && step compile 180 "$PY" -m fastrl.bench --env doom_battle --mode train --device cuda \
    --seconds 20 --warmup 20 --with_wandb false --compile_learner on

# What a GPU run trains while its learner compiles in the background: one measured
# run trained a tenth of its rate for the compile's 35 s, the
# eager step (the host launching kernels) waiting on the GIL behind the compiling
# thread's tracing. Since the compile thread holds the switch interval at 0.1 ms, a
# CPU step beside it takes 1.02x its time alone (1.73x at 5 ms): the status lines
# every 5 s, before and after the "runs compiled" line, say whether a GPU step does.
wants compile_stall && step compile_stall 150 "$PY" -m fastrl.train --env doom_defend_the_center --device cuda \
    --compile_learner on --train_for_seconds 110 --status_every_seconds 5 --with_wandb false \
    --train_dir /tmp/compile_stall --restart

# The continuous-control preset on this machine: Hopper-v5 for SECONDS_PER_RUN from
# launch on the GPU, then on the CPU alone, the same seed: whether a GPU pays for a
# small MLP's learner where the cores are many, which --device auto predicts to choose.
if wants mujoco; then
    for dev in cuda cpu; do
        step mujoco_$dev $(( SECONDS_PER_RUN + 60 )) "$PY" benchmarks/learning_suite.py --envs Hopper-v5 \
            --systems fastrl --seeds 1 --seconds "$SECONDS_PER_RUN" --report_seconds 5 --out /tmp/mujoco_$dev \
            --fastrl_extra=--device=$dev --tag $dev
        for f in /tmp/mujoco_$dev/logs/*; do { echo "--- head and tail of $f"; head -n 25 "$f"; tail -n 8 "$f"; } >>"$OUT/mujoco_$dev.log"; done
    done
fi

# fastrl against Sample Factory on doom_battle, both on the GPU, one rollout worker
# per core and one GPU inference process on each side.
if wants battle; then
    step vs_sf_battle $(( ${ROUNDS:-1} * (2 * SECONDS_PER_RUN + 90) + 60 )) "$PY" "${VS[@]}" --scenario battle --env_check_seconds 10 \
        --json "$OUT/vs_sf_battle.json"
    runs_tail vs_sf_battle
fi

# fastrl's defaults (--plan auto) on this machine.
wants planned && step planned $(( SECONDS_PER_RUN + 90 )) "$PY" -m fastrl.train --env doom_battle \
    --train_dir /tmp/planned --restart --train_for_seconds "$SECONDS_PER_RUN" --status_every_seconds 5 \
    --with_wandb false

# doom_defend_the_center, the same scenario file on both sides.
if wants dtc; then
    step vs_sf_dtc $(( ${ROUNDS:-1} * (2 * SECONDS_PER_RUN + 90) + 30 )) "$PY" "${VS[@]}" --scenario defend_the_center \
        --env_check_seconds 0 --json "$OUT/vs_sf_dtc.json"
    runs_tail vs_sf_dtc
fi

echo "=== summary"
cd "$OUT"
[ -f gpu_tests.log ] && tail -n 30 gpu_tests.log
[ -f precision.log ] && grep -E "precision|forward|learner|step" precision.log | head -20
for f in layout_*.log; do [ -f $f ] && { echo "--- $f"; grep -E "^layout|^train |^  (rollout|policy|learner) |GPU|bottleneck|core time|lag" $f; }; done
for f in vs_sf_battle.log vs_sf_dtc.log; do [ -f $f ] && grep -E "^env only|^round|median ratio|still starting|warning|TRACEBACK|Error" $f; done
for f in mujoco_cuda.log mujoco_cpu.log; do [ -f $f ] && { echo "--- $f"; grep -E "^\\| Hopper|Traceback|Error" $f; }; done
[ -f compile.log ] && grep -E "^train |learner:|bottleneck" compile.log
[ -f planned.log ] && grep -E "plan|inference|\] frames|Traceback|Error" planned.log | head -20
exit 0
