"""The non-finite guard: flags computed in the compiled step (`flags`), read
on the host when a chunk returns (`raise_if_nonfinite`), which raises for the
first iteration with a problem, naming its cause and fix."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, PyTree

from ._rollout import Transition

OVERFLOW = 1e18
"""Finite values beyond this overflow float32 arithmetic once squared
(variances, value errors): they are named as an overflow, not a NaN."""


def _inexact(tree: PyTree) -> list[Array]:
    return [
        x
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]


def _finite_per(tree: PyTree, n_axes: int) -> Bool[Array, "..."]:
    """Whether every value of the leading `n_axes` positions is finite."""
    leaves = _inexact(tree)
    if not leaves:
        return jnp.array(True)
    per = [jnp.isfinite(x).reshape(*x.shape[:n_axes], -1).all(axis=-1) for x in leaves]
    return jnp.stack(per).all(axis=0)


def _magnitude(tree: PyTree) -> Array:
    leaves = [
        jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), initial=0.0)
        for x in _inexact(tree)
    ]
    return jnp.max(jnp.stack(leaves)) if leaves else jnp.zeros(())


def _first(bad: Bool[Array, "time env"]) -> tuple[Array, Array]:
    """`(t, env)` of the first bad entry in time order (`(-1, -1)` if none)."""
    t, env = jnp.divmod(jnp.argmax(bad.ravel()), bad.shape[1])
    found = bad.any()
    return tuple(jnp.where(found, i, -1).astype(jnp.int32) for i in (t, env))


def flags(
    data: Transition, final_obs: PyTree[Array], loss: Array, updated: PyTree
) -> dict[str, Array]:
    """The guard's per-iteration flags (under `debug/`)."""
    obs_ok = jnp.concatenate(
        [_finite_per(data.obs, 2), _finite_per(final_obs, 1)[None]]
    )
    if data.terminal_obs is not None:
        # A time limit's terminal observation, kept for bootstrapping: it came
        # from `env.step` like the step's reward.
        obs_ok = obs_ok.at[1:].set(obs_ok[1:] & _finite_per(data.terminal_obs, 2))
    t, env = _first(~obs_ok)
    # An observation after a `done` is a start state from `env.reset`.
    after_done = jnp.concatenate([jnp.zeros_like(data.done[:1]), data.done])
    reward_t, reward_env = _first(~_finite_per(data.reward, 2))
    return {
        "debug/obs_step": t,
        "debug/obs_env": env,
        "debug/obs_from_reset": after_done[jnp.maximum(t, 0), jnp.maximum(env, 0)],
        "debug/reward_env": reward_env,
        "debug/obs_max": jnp.maximum(_magnitude(data.obs), _magnitude(final_obs)),
        "debug/reward_max": _magnitude(data.reward),
        "debug/finite_loss": jnp.isfinite(loss).all(),
        "debug/finite_update": _finite_per(updated, 0),
    }


def _problem(f: dict[str, Any], learner: Any) -> tuple[str, str] | None:
    """What went wrong in one iteration's flags, and the fix."""
    env_fix = (
        "Check the env (run it with `jax.config.update('jax_debug_nans', True)` "
        "to find the operation)."
    )
    if f["debug/obs_env"] >= 0:
        source = (
            "env.reset (a start state)" if f["debug/obs_from_reset"] else "env.step"
        )
        env = int(f["debug/obs_env"])
        return f"observation from env {env}, returned by {source}", env_fix
    if f["debug/reward_env"] >= 0:
        env = int(f["debug/reward_env"])
        return f"reward from env {env}, returned by env.step", env_fix
    if f["debug/finite_loss"] and f["debug/finite_update"]:
        return None
    what = "optimiser update (parameters or Adam state)"
    what = what if f["debug/finite_loss"] else "loss"
    scaling = float(np.asarray(getattr(learner, "reward_scaling", 1.0)))
    if f["debug/obs_max"] > OVERFLOW:
        return what, (
            f"The observations are finite but reach {float(f['debug/obs_max']):.3g}, "
            "which overflows float32 arithmetic (their squares exceed 3.4e38): "
            "scale the env's observations down."
        )
    if f["debug/reward_max"] * scaling > OVERFLOW:
        return what, (
            f"The rewards times reward_scaling reach "
            f"{float(f['debug/reward_max']) * scaling:.3g}, which overflows float32 "
            "arithmetic: lower `reward_scaling` or scale the env's rewards down."
        )
    clipping = (
        "set `gradient_clipping`"
        if getattr(learner, "gradient_clipping", None) is None
        else "keep `gradient_clipping` on"
    )
    if what == "loss":
        has_kl = "target_kl" in {f.name for f in dataclasses.fields(learner)}
        stop = ", or set `target_kl`" if has_kl else ""
        return what, (
            "The observations and rewards were finite, so the update diverged: "
            f"lower `learning_rate`, {clipping}{stop}."
        )
    return what, (
        "The loss was finite, so the optimiser step overflowed: lower "
        f"`learning_rate` or `weight_decay`, {clipping}."
    )


def raise_if_nonfinite(
    chunk: dict[str, np.ndarray], first_iteration: int, n_active: int, learner: Any
) -> None:
    """Raise for the chunk's first iteration with a problem (host flags,
    `[seeds, iterations]` each)."""
    n_seeds = chunk["debug/finite_loss"].shape[0]
    for i in range(n_active):
        for seed in range(n_seeds):
            found = _problem({k: v[seed, i] for k, v in chunk.items()}, learner)
            if found is not None:
                what, fix = found
                seed_note = f" (seed index {seed})" if n_seeds > 1 else ""
                raise FloatingPointError(
                    f"Non-finite {what}{seed_note} at iteration "
                    f"{first_iteration + i + 1}; training stopped, and no state from "
                    f"that iteration on was returned or checkpointed. {fix} To train "
                    "on regardless, set `check_finite=False`."
                )


def check_host_values(tree: PyTree, what: str, unit: str, fix: str) -> None:
    """Raise a `FloatingPointError` if a host-side tree holds NaN or inf,
    naming the first bad index of its leading axis (`unit`: "env", "seed")."""
    for x in jax.tree.leaves(tree):
        x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.inexact) or np.isfinite(x).all():
            continue
        bad = ~np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1) if x.ndim else [True]
        where = f" ({unit} {int(np.argmax(bad))})" if x.ndim else ""
        raise FloatingPointError(
            f"Non-finite {what}{where}; training stopped before anything was "
            f"checkpointed. {fix}"
        )
