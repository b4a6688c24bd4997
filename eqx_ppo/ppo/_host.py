"""What the driver does on the host: metrics as floats, compile timing, the
progress bar and videos."""

import concurrent.futures
import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from ..nn._module import AbstractStatefulModule
from ._rollout import SaveAt, fresh_episodes


def to_host(
    metrics: dict[str, Any], n_seeds: int, index: int | None = None
) -> dict[str, Any]:
    """Device metrics `[seed, ...]` as floats (one seed) or per-seed lists,
    taking row `index` of a chunk's `[seed, iteration]` metrics."""
    out = {}
    for name, value in jax.device_get(metrics).items():
        value = np.asarray(value if index is None else value[:, index], np.float64)
        out[name] = float(value[0]) if n_seeds == 1 else value.tolist()
    return out


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's garbage collector off inside: its full passes walk every object
    a trace holds, which made tracing up to 2x slower (accelerator guide)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class CompileTimer:
    """The seconds JAX spends compiling in this thread while open (`seconds`)
    and the wall time left for running (`running`), so rates leave
    compilation out (`wait` adds the wait for a compile in another thread)."""

    _EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __enter__(self) -> "CompileTimer":
        self.seconds, self._thread = 0.0, threading.get_ident()
        jax.monitoring.register_event_duration_secs_listener(self._add)
        self.start = time.perf_counter()
        return self

    def _add(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in self._EVENTS and threading.get_ident() == self._thread:
            self.seconds += duration

    def wait(self, future: concurrent.futures.Future) -> Any:
        """`future`'s result, the time waited for it counted as compiling."""
        start = time.perf_counter()
        result = future.result()
        self.seconds += time.perf_counter() - start
        return result

    def __exit__(self, *exc_info: Any) -> None:
        self.running = max(time.perf_counter() - self.start - self.seconds, 1e-9)
        jax.monitoring.unregister_event_duration_listener(self._add)


class Progress:
    """A bar of env steps over all seeds, whose times leave compilation out."""

    def __init__(self, enabled: bool, initial: int, total: int):
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="env-step",
            unit_scale=True,
            desc="compiling",
            disable=not enabled,
        )

    def leave_out(self, seconds: float) -> None:
        """Move the bar's clock past `seconds` spent compiling."""
        if not self.bar.disable:  # a disabled bar keeps no clock
            self.bar.start_t += seconds

    def advance(self, n: int, compiling: float, rate: float) -> None:
        self.leave_out(compiling)
        self.bar.set_description("train")
        self.bar.update(n)
        self.bar.set_postfix_str(f"{rate:,.0f} steps/s now", refresh=False)

    def show_return(self, value: float | list[float]) -> None:
        self.bar.set_postfix(eval_return=f"{float(np.mean(value)):.3g}")

    def close(self) -> None:
        self.bar.close()


@eqx.filter_jit
def _episode(env, network, length: int, key: PRNGKeyArray):
    # Episodes continue past `done` in the video: env and carry reset
    # together, exactly as in training.
    save = SaveAt(transitions=("reward",), env_states=True)
    steps = fresh_episodes(env, network, key, 1, length, save, reset="fresh")
    alive = ~steps.finished[:, 0]
    reward = sum(jax.tree.leaves(steps.transitions.reward))[:, 0]
    total = jnp.sum(jnp.where(alive, reward, 0.0))
    states = jax.tree.map(lambda x: x[:, 0], steps.env_states)
    return states, total, jnp.sum(alive.astype(jnp.int32))


def record_video(
    env: Any, network: AbstractStatefulModule, config: Any, key: PRNGKeyArray, step: int
) -> tuple[np.ndarray, int, float, int] | None:
    """`(frames, step, episode_reward, episode_length)` of one inference-mode
    episode of `config.episode_length` steps (`key` folded with `step`), or
    `None` for an env without `render`. `env.render` gets Playground's env
    states, or Brax's and the built-in envs' `pipeline_state`s."""
    render = getattr(env, "render", None)
    if render is None:
        return None
    length = config.episode_length
    key = jax.random.fold_in(key, step)
    states, total, steps = _episode(env, eqx.nn.inference_mode(network), length, key)
    trajectory = states if hasattr(states, "data") else states.pipeline_state
    frames = render(
        [jax.tree.map(lambda x, i=i: x[i], trajectory) for i in range(length)],
        **config.render_kwargs,
    )
    return np.stack([np.asarray(f) for f in frames]), step, float(total), int(steps)
