"""An experiment, not a setting: compile JAX's threefry hash on a TPU as a
rolled loop (the form XLA:CPU gets) instead of 20 unrolled rounds.

    PYTHONPATH=benchmarks/rolled_threefry:$PYTHONPATH python -m benchmarks.compile_time

Python imports this file at start-up in every process that has the folder on
its path, workers included, so eqx_ppo and Brax PPO both get it. The hash's
bits are the same; what changes is XLA:TPU's compile time and the speed of
every draw (results: `results/tpu_rolled_threefry_*`, `benchmarks/README.md`).
It uses two private names of JAX 0.10.
"""

from jax._src.random import threefry2x32
from jax.interpreters import mlir

mlir.register_lowering(
    threefry2x32.threefry2x32_p,
    threefry2x32._threefry2x32_cpu_lowering_rule,
    platform="tpu",
)
