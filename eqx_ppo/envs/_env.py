"""The environment protocol: what the library needs from an env."""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, PRNGKeyArray, PyTree

from ._state import State

Size = int | tuple[int, ...] | dict[str, Any]
"""An observation or action size: an int (flat vector), a shape, or a dict of them."""


class AbstractEnv(eqx.Module):
    """Base class of the built-in envs, wrappers and adapters.

    The protocol is Brax's / MuJoCo Playground's, so their envs work unchanged
    wherever an `AbstractEnv` is accepted; subclassing is only a convenience.
    `reset(key)` and `step(state, action)` handle **one** env and return states
    of identical structure and dtypes; the library `vmap`s them and resets envs
    whose `done` is set. Optional: `max_len`, the most steps an episode lasts
    (the CLI evaluates episodes of that length, else 1000), and
    `render(trajectory, height=..., width=...)`.
    """

    @abc.abstractmethod
    def reset(self, key: PRNGKeyArray) -> State:
        """The state at the start of an episode."""

    @abc.abstractmethod
    def step(self, state: State, action: PyTree[Array]) -> State:
        """The state after taking `action` in `state`."""

    @property
    @abc.abstractmethod
    def observation_size(self) -> Size:
        """The observation's size (an int, or a dict mirroring the observation)."""

    @property
    @abc.abstractmethod
    def action_size(self) -> Size:
        """The action's size (an int, or a dict mirroring the action)."""

    @property
    def n_actions(self) -> int | tuple[int, ...] | dict[str, Any] | None:
        """`None` for continuous actions, else the number of discrete choices."""
        return None

    @property
    def dt(self) -> float:
        """Seconds per step."""
        return 1.0

    @property
    def unwrapped(self) -> "AbstractEnv":
        """The innermost env, with every wrapper removed."""
        return self


@eqx.filter_jit
def reset_one(env: Any, key: PRNGKeyArray) -> Any:
    """`env.reset(key)`, jitted so that JAX keeps one trace of the env's code
    per env and key type: every program of a run (at any number of envs, under
    their `vmap`) and a wrapper's `observation_size` share it."""
    return env.reset(key)


@eqx.filter_jit
def step_one(env: Any, state: Any, action: PyTree[Array]) -> Any:
    """`env.step(state, action)`, jitted as `reset_one` is."""
    return env.step(state, action)


def reported_truncation(state: Any) -> Bool[Array, "*env"]:
    """Whether the env reports a time-limit end in `info["truncation"]` (Brax)
    or `info["truncated"]` (gymnax)."""
    for name in ("truncation", "truncated"):
        if name in state.info:
            return jnp.asarray(state.info[name]).astype(bool)
    return jnp.zeros(jnp.shape(state.done), bool)


def check_action(
    env: Any, action: Any, shape: tuple[int, ...], n: int | None = None
) -> Array:
    """`action` as a float array of `shape`, or as an integer scalar for `n`
    discrete choices; else a `ValueError`."""
    action = jnp.asarray(action)
    kind = jnp.floating if n is None else jnp.integer
    if action.shape == shape and jnp.issubdtype(action.dtype, kind):
        return action
    if n is None:
        wanted = f"a float action of shape {shape}"
        size = shape[0] if len(shape) == 1 else shape
        fix = f"action_size={size} (the env's `action_size`)"
    else:
        wanted = f"an integer scalar action in [0, {n})"
        fix = f"discrete=True and action_size={n} (the env's `n_actions`)"
    raise ValueError(
        f"`{type(env).__name__}.step`: expected {wanted}, got dtype "
        f"{action.dtype} and shape {action.shape}. Build the policy with {fix}."
    )


def check_action_tree(env: Any, action: Any, shapes: dict[str, Any]) -> Any:
    """Check a dict action against `shapes` (same keys; leaves are shape tuples)."""
    shape_tree = jax.tree.structure(shapes, is_leaf=lambda x: isinstance(x, tuple))
    if jax.tree.structure(action) != shape_tree:
        got = jax.tree.map(jnp.shape, action)
        raise ValueError(
            f"`{type(env).__name__}.step`: expected a dict action with shapes "
            f"{shapes}, got {got}. Build the policy's action port with these keys."
        )
    return jax.tree.map(lambda a, s: check_action(env, a, s), action, shapes)


def check_env(env: Any, name: str = "env") -> None:
    """A `TypeError` naming the argument `name` unless `env` is a hashable
    instance with `reset(key)` and `step(state, action)` (not a raw gymnax env)."""
    _check_not_batched(name, env)
    if isinstance(env, AbstractEnv):
        return
    if isinstance(env, type):
        fix = f"pass an instance, e.g. {env.__name__}()"
    elif hasattr(env, "default_params") and hasattr(env, "step_env"):
        fix = (
            "this looks like a gymnax env, whose reset and step take params; "
            "wrap it: eqx_ppo.envs.GymnaxAdapter(env), or use "
            "eqx_ppo.envs.make('gymnax:<name>')"
        )
    elif callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        try:
            hash(env)
        except TypeError:
            fix = (
                "the env is a static argument of the compiled programs, so it "
                "must be hashable; make it an eqx.Module (eqx_ppo.envs.AbstractEnv), "
                "or give its class eq=False / frozen=True if it is a dataclass"
            )
        else:
            return
    else:
        fix = (
            "pass an env with `reset(key)` and `step(state, action)` (the Brax / "
            "MuJoCo Playground protocol), e.g. eqx_ppo.envs.make('cartpole')"
        )
    got = f"the class {env.__name__}" if isinstance(env, type) else type(env).__name__
    raise TypeError(f"{name}=...: expected an env, got {got}. Fix: {fix}.")


# Brax's and MuJoCo Playground's training wrappers, which the library's own
# `vmap` and auto-reset replace (by class name: neither package is imported).
_TRAINING_WRAPPERS = {
    "VmapWrapper": "batches the env",
    "DomainRandomizationVmapWrapper": "batches the env",
    "BraxDomainRandomizationVmapWrapper": "batches the env",
    "AutoResetWrapper": "resets finished episodes inside step",
    "BraxAutoResetWrapper": "resets finished episodes inside step",
}


def _check_not_batched(name: str, env: Any) -> None:
    """A `TypeError` if `env` is wrapped for Brax's training loop: a batched
    env fails inside JAX, and an auto-resetting one trains silently on the
    next episode's first observation in place of the terminal one."""
    inner = env
    for _ in range(64):
        wrapper = type(inner).__name__
        if wrapper in _TRAINING_WRAPPERS:
            raise TypeError(
                f"{name}=...: the env is wrapped in {wrapper}, which "
                f"{_TRAINING_WRAPPERS[wrapper]}; eqx_ppo vmaps single-env "
                "`reset` / `step` and resets episodes itself. Fix: pass the env "
                "before Brax's / Playground's training wrappers, e.g. "
                "brax.envs.get_environment(...) or create(..., auto_reset=False, "
                "batch_size=None), or eqx_ppo.envs.make('brax:<name>')."
            )
        inner = getattr(inner, "env", None)
        if inner is None or isinstance(inner, type):
            return
