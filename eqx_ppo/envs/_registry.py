"""`make`: ready-to-train envs by name, built-in or from Brax, Playground, gymnax
or popgym-arcade."""

import dataclasses
import difflib
import functools
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, NamedTuple

import jax

from .._optional import import_optional
from .._typecheck import Int, check_range, checked
from ._cartpole import CartPole
from ._counter import Counter
from ._dict_env import DictObsAct
from ._gymnax import GymnaxAdapter
from ._move_to_center import MoveToCenter
from ._parrot import Parrot
from ._pendulum import Pendulum
from ._popgym import CountRecall, RepeatFirst, RepeatPrevious
from ._recall import Recall
from ._two_arm import TwoArm
from ._wrappers import EpisodeWrapper

# name -> (constructor, default episode limit; None for envs that end by themselves)
_BUILTIN: dict[str, tuple[Callable[..., Any], int | None]] = {
    "cartpole": (CartPole, 500),
    "cartpole_no_velocity": (functools.partial(CartPole, hide_velocity=True), 500),
    "count_recall": (CountRecall, None),
    "count_recall_hard": (functools.partial(CountRecall, n_values=8, length=64), None),
    "counter": (Counter, None),
    "dict_obs_act": (DictObsAct, 20),
    "move_to_center": (MoveToCenter, 20),
    "parrot": (Parrot, 10),
    "pendulum": (Pendulum, 200),
    "pendulum_no_velocity": (functools.partial(Pendulum, hide_velocity=True), 200),
    "recall": (Recall, None),
    "repeat_first": (RepeatFirst, None),
    "repeat_first_hard": (functools.partial(RepeatFirst, n_cards=16, length=64), None),
    "repeat_previous": (RepeatPrevious, None),
    "repeat_previous_hard": (functools.partial(RepeatPrevious, k=8, length=64), None),
    "two_arm": (TwoArm, 20),
}


def registered_names() -> tuple[str, ...]:
    """The names of the built-in envs `make` knows, sorted (not the
    `"<prefix>:<name>"` envs of other simulators that `make` also accepts)."""
    return tuple(sorted(_BUILTIN))


def _brax(brax_envs: Any, name: str, kwargs: dict[str, Any]) -> tuple[Any, int]:
    return brax_envs.get_environment(name, **kwargs), 1000


def _playground(mp: Any, name: str, kwargs: dict[str, Any]) -> tuple[Any, int]:
    if "impl" not in kwargs and jax.default_backend() == "cpu":
        warnings.warn(
            f"make('playground:{name}'): on CPU, using the JAX (MJX) backend; "
            "pass impl='warp' to use MuJoCo Warp, or impl='jax' to choose it "
            "and silence this.",
            stacklevel=3,
        )
    kwargs = pinned_kwargs(f"playground:{name}", kwargs)
    env = mp.registry.load(name, config_overrides=kwargs)
    config = mp.registry.get_default_config(name)
    repeat = kwargs.get("action_repeat", config.get("action_repeat", 1))
    if repeat != 1:
        warnings.warn(
            f"make('playground:{name}'): the env config's action_repeat={repeat} "
            "is not applied: each action is one env step, and the episode limit "
            "counts those. For Playground's control rate, wrap the env yourself: "
            "brax.envs.wrappers.training.EpisodeWrapper(mujoco_playground."
            f"registry.load({name!r}), episode_length, action_repeat).",
            stacklevel=3,
        )
    return env, int(config.episode_length)


def pinned_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with a Playground env's backend `impl` made explicit (`"jax"` on
    CPU), so a run saved in `run.json` rebuilds the same env on another machine."""
    if not name.startswith("playground:") or "impl" in kwargs:
        return kwargs
    if jax.default_backend() == "cpu":
        return {**kwargs, "impl": "jax"}
    from mujoco_playground import registry

    config = registry.get_default_config(name.removeprefix("playground:"))
    return {**kwargs, "impl": config.get("impl", "warp")}


def _gymnax(gymnax: Any, name: str, kwargs: dict[str, Any]) -> tuple[Any, None]:
    env_params = kwargs.pop("env_params", None)
    env, params = gymnax.make(name, **kwargs)
    if isinstance(env_params, Mapping):
        known = {f.name for f in dataclasses.fields(params)}
        unknown = sorted(set(env_params) - known)
        if unknown:
            raise ValueError(
                f"make('gymnax:{name}', env_params=...): {unknown} are not "
                f"parameters of {type(params).__name__}; it has {sorted(known)}."
            )
        params = params.replace(**env_params)
    elif env_params is not None:
        params = env_params
    return GymnaxAdapter(env, params), None


def _popgym_arcade(
    popgym_arcade: Any, name: str, kwargs: dict[str, Any]
) -> tuple[Any, None]:
    env, params = popgym_arcade.make(name, **kwargs)
    # The limit lives on the env under one of two names; the params' field,
    # where there is one, is the stable-gymnax default (1) for some envs.
    limit = getattr(
        env, "max_steps_in_episode", getattr(env, "max_episode_length", None)
    )
    return GymnaxAdapter(
        env, params, flatten_obs=False, truncation_from_info=True, max_len=limit
    ), None


class _Source(NamedTuple):
    """Envs of another simulator, made by `make("<prefix>:<name>")`."""

    title: str  # in errors
    package: str  # the module imported, only when asked for
    extra: str  # the pip extra that installs it
    names: Callable[[Any], Collection[str]]  # its env names, from the package
    build: Callable[[Any, str, dict[str, Any]], tuple[Any, int | None]]


_SOURCES = {
    # brax's registry has no public list
    "brax": _Source("brax", "brax.envs", "brax", lambda m: m._envs, _brax),
    "playground": _Source(
        "MuJoCo Playground",
        "mujoco_playground",
        "playground",
        lambda m: m.registry.ALL_ENVS,
        _playground,
    ),
    "gymnax": _Source(
        "gymnax", "gymnax", "gymnax", lambda m: m.registered_envs, _gymnax
    ),
    "popgym_arcade": _Source(
        "popgym-arcade",
        "popgym_arcade",
        "popgym-arcade",
        lambda m: m.registration.REGISTERED_ENVIRONMENTS,
        _popgym_arcade,
    ),
}


def _from_source(
    prefix: str, name: str, kwargs: dict[str, Any]
) -> tuple[Any, int | None]:
    source = _SOURCES[prefix]
    module = import_optional(source.package, f"make('{prefix}:{name}')", source.extra)
    known = source.names(module)
    if name not in known:
        # The closest known name, by spelling and ignoring case.
        by_lower = {k.lower(): k for k in known}
        close = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=0.6)
        guess = f" Did you mean {by_lower[close[0]]!r}?" if close else ""
        raise ValueError(
            f"make('{prefix}:{name}'): {source.title} has no env {name!r}.{guess} "
            f"It has: {', '.join(sorted(known))}."
        )
    return source.build(module, name, kwargs)


@checked
def make(
    name: str,
    *,
    episode_length: Int | Literal["default"] | None = "default",
    **kwargs: Any,
) -> Any:
    """A ready-to-train env by name.

    Built-in names are listed by [`eqx_ppo.envs.registered_names`][]; other
    simulators' envs are imported only when asked for, by a prefix
    (`"brax:<name>"`, `"playground:<name>"`, `"gymnax:<name>"`,
    `"popgym_arcade:<name>"`). The tables below give each one's keyword
    arguments and default time limit.

    **Arguments:**

    - `name`: a built-in name or a `prefix:<name>`.
    - `episode_length`: `"default"` for the env's default limit (an
      [`eqx_ppo.envs.EpisodeWrapper`][]), an int to set it, or `None` for none.
    - `kwargs`: passed to the env's constructor.
    """
    prefix, _, inner = name.partition(":")
    if inner and prefix in _SOURCES:
        env, default_length = _from_source(prefix, inner, kwargs)
    elif not inner and name in _BUILTIN:
        constructor, default_length = _BUILTIN[name]
        env = constructor(**kwargs)
    else:
        unknown = f"prefix {prefix!r}" if inner else "env"
        raise ValueError(
            f"make({name!r}): unknown {unknown}. Built-in envs: "
            f"{', '.join(registered_names())}; or use a prefix: "
            f"{', '.join(p + ':<name>' for p in _SOURCES)}."
        )
    if episode_length == "default":
        episode_length = default_length
    if episode_length is None:
        return env
    fix = "a positive int, 'default' for the env's own limit, or None for none."
    check_range(f"make({name!r}, episode_length=", episode_length, 1, fix=fix)
    return EpisodeWrapper(env, episode_length)
