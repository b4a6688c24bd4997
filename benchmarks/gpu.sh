#!/usr/bin/env bash
# The GPU benchmark: one command on a machine with an NVIDIA GPU.
#
# Needs the bench extra and a CUDA JAX in the Python it runs
# (`pip install -e ".[bench]" "jax[cuda12]"`; set PYTHON to choose one).
# Writes benchmarks/results/gpu_*.{json,md} like every other benchmark:
#   - eqx_ppo vs Brax PPO and rejax on Brax inverted_pendulum, 4x256 swish MLPs,
#     2048 and 8192 envs, 50 iterations each, and on MuJoCo Playground's
#     CartpoleBalance (impl="jax", MJX) at 2048 envs;
#   - 64 seeds x 64 envs in one vmapped program vs one 4096-env run;
#   - the memory cells' replay (loss + gradient) at T = 16, 64, 256, both
#     replay paths of the linear recurrences;
#   - the fused actor-critic forms (benchmarks/fusion.py) at one 8192-env
#     minibatch, 4x256.
# GPU_BENCH_CHECK=1 runs the same sequence at toy sizes on any backend, to
# check the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [[ "${GPU_BENCH_CHECK:-0}" == 1 ]]; then
    ENVS=(64) ITERS=2 SEEDS=2 PER_SEED=16 MEMORY=(--quick) FUSION=(--rows 64 --rounds 5)
    PREFIX=gpucheck
else
    "$PY" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' || {
        echo "gpu.sh: JAX sees no GPU here (set GPU_BENCH_CHECK=1 to test the script)" >&2
        exit 2
    }
    ENVS=(2048 8192) ITERS=50 SEEDS=64 PER_SEED=64 MEMORY=()
    FUSION=(--rows 20480 --hidden 256,256,256,256 --rounds 100) PREFIX=gpu
fi
start=$SECONDS
for n in "${ENVS[@]}"; do
    "$PY" -m benchmarks.compare --env inverted_pendulum --systems eqx,brax,rejax \
        --n-envs "$n" --hidden 256,256,256,256 --steps $((n * 20 * ITERS)) \
        --reps 1 --chunks 5 --no-ceilings --name "${PREFIX}_compare_inverted_pendulum_$n"
done
"$PY" -m benchmarks.compare --env cartpole_balance --systems eqx,brax,rejax \
    --n-envs "${ENVS[0]}" --hidden 256,256,256,256 --steps $((ENVS[0] * 20 * ITERS)) \
    --reps 1 --chunks 5 --no-ceilings --name "${PREFIX}_compare_cartpole_balance_${ENVS[0]}"
"$PY" -m benchmarks.multiseed --seeds "$SEEDS" --envs-per-seed "$PER_SEED" \
    --steps-per-seed $((PER_SEED * 20 * ITERS)) --reps 1 --no-sequential \
    --name "${PREFIX}_multiseed"
"$PY" -m benchmarks.memory --part replay "${MEMORY[@]}" --name "${PREFIX}_memory"
"$PY" -m benchmarks.fusion "${FUSION[@]}" --name "${PREFIX}_fusion"
echo "gpu.sh: done in $((SECONDS - start)) s"
