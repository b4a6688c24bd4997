"""Containers: compose stateful modules into one.

Every container routes the five per-call channels the same way:

- `state`, `extras` and `metrics` are dicts keyed like the children: integer
  positions for [`eqx_ppo.nn.Sequential`][], the child names for the named
  containers. `extras=None` hands `None` to every child.
- The regularisation losses of the children are summed.
- `replay_envs` replays child by child with the same routing, so in the
  loss replay only recurrent children are scanned over time, and the others
  run once over all the minibatch's steps.
- `key` goes only to the children whose `uses_key` is set, by `route_keys`:
  a single such child gets `key` itself, several get one split of it, in the
  order the children are stored (positions for `Sequential`, sorted names for
  the named containers), so each child sees the same noise whether it is
  called eagerly, under `jit`, or in loss replay.

**Key order.** Named containers store their children sorted by name. JAX
flattens dicts in sorted-key order, so this is the only order that survives a
round trip through `jax.tree_util` unchanged (under `jit`, `vmap` or
`tree_map`); using it everywhere means that `Concat`'s output layout and the
key each child receives do not depend on how the container was built or
transformed.
"""

import abc
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Key, PRNGKeyArray

from ._keys import route_keys, route_sequence_keys
from ._module import (
    AbstractReplayEnvs,
    AbstractStatefulModule,
    SequenceOutput,
    State,
    StatefulModuleOutput,
    check_env_batch,
    checked_output,
    zero_loss,
)


def _child_extras(extras: Any, names: Iterable[Any]) -> dict:
    if extras is None:
        return {name: None for name in names}
    return extras


def _named_children(
    container: str,
    modules: Mapping[str, AbstractStatefulModule] | None,
    kwargs: dict[str, AbstractStatefulModule],
) -> dict[str, AbstractStatefulModule]:
    """Validate the two ways to name children and return them sorted by name."""
    if modules is not None and kwargs:
        raise ValueError(
            f"`{container}(...)` got both a positional dict and keyword arguments; "
            f"pass the children one way, e.g. `{container}(a=module_a, b=module_b)` "
            f'or `{container}({{"a": module_a, "b": module_b}})`.'
        )
    if modules is not None and not isinstance(modules, Mapping):
        raise TypeError(
            f"`{container}` takes its children by name, as a dict or keywords, "
            f"got {type(modules).__name__}; pass e.g. "
            f"`{container}(a=module_a, b=module_b)`."
        )
    children = dict(kwargs if modules is None else modules)
    if not children:
        raise ValueError(
            f"`{container}()` needs at least one child module, got none; pass e.g. "
            f"`{container}(a=module_a, b=module_b)`."
        )
    for name, child in children.items():
        if not isinstance(name, str):
            raise TypeError(
                f"`{container}`: child names must be strings, got {name!r} "
                f"({type(name).__name__}); use string keys."
            )
        if not isinstance(child, AbstractStatefulModule):
            raise TypeError(
                f"`{container}`: child {name!r} must be an AbstractStatefulModule, "
                f"got {type(child).__name__}; wrap plain functions in a layer."
            )
    return {name: children[name] for name in sorted(children)}


def _gather(outs: dict[Any, StatefulModuleOutput], output: Any) -> StatefulModuleOutput:
    """A container's step from its children's: carries, metrics and extras
    keyed like the children, their losses summed in order."""
    return StatefulModuleOutput(
        next_state={k: out.next_state for k, out in outs.items()},
        output=output,
        regularization_loss=sum(
            (out.regularization_loss for out in outs.values()), zero_loss()
        ),
        metrics={k: out.metrics for k, out in outs.items()},
        extras={k: out.extras for k, out in outs.items()},
    )


def _gather_sequences(
    outs: dict[Any, SequenceOutput], output: Any, done: Bool[Array, "time env"]
) -> SequenceOutput:
    """`_gather` for the children's replays of a `[T, M]` batch."""
    return SequenceOutput(
        last_state={k: out.last_state for k, out in outs.items()},
        output=output,
        regularization_loss=sum(
            (out.regularization_loss for out in outs.values()),
            jnp.zeros(done.shape, jnp.float32),
        ),
    )


def _run_children(
    children: dict[str, AbstractStatefulModule],
    state: dict,
    inputs: dict,
    extras: dict | None,
    key: PRNGKeyArray | None,
) -> StatefulModuleOutput:
    """Call every child on its own input; each channel becomes a dict by name."""
    extras = _child_extras(extras, children)
    keys = route_keys(key, list(children.values()))
    outs = {
        name: checked_output(
            child,
            state[name],
            child(state[name], inputs[name], extras[name], key=child_key),
        )
        for (name, child), child_key in zip(children.items(), keys, strict=True)
    }
    return _gather(outs, {name: out.output for name, out in outs.items()})


def _replay_children(
    children: dict[str, AbstractStatefulModule],
    state0: dict,
    inputs: dict,
    extras: dict | None,
    keys: Key[Array, "time env"] | None,
    done: Bool[Array, "time env"],
) -> SequenceOutput:
    """`_run_children` over a `[T, M]` batch: every child replays its own."""
    extras = _child_extras(extras, children)
    child_keys = route_sequence_keys(keys, list(children.values()))
    outs = {
        name: child.replay_envs(
            state0[name], inputs[name], extras[name], child_key, done
        )
        for (name, child), child_key in zip(children.items(), child_keys, strict=True)
    }
    return _gather_sequences(
        outs, {name: out.output for name, out in outs.items()}, done
    )


def _check_state(container: str, state: Any, names: Iterable[Any]) -> None:
    """A container's carry is a dict by child; say how to build one otherwise."""
    names = list(names)
    if isinstance(state, Mapping) and all(name in state for name in names):
        return
    seen = sorted(state) if isinstance(state, Mapping) else type(state).__name__
    raise TypeError(
        f"`{container}`: the state must be the dict of its children's carries "
        f"(keys {names}), got {seen!r}. Build it with "
        "`net.initial_state()` (one env) or `net.initialize_state(batch_size)`."
    )


def _check_has_keys(container: str, x: Any, names: Iterable[str]) -> None:
    if not isinstance(x, Mapping):
        raise TypeError(
            f"`{container}` dispatches a dict input by key, got "
            f"{type(x).__name__}; feed it a dict with keys {sorted(names)}."
        )
    missing = [name for name in names if name not in x]
    if missing:
        raise ValueError(
            f"`{container}`: the input dict has no entry for children {missing}; "
            f"it has keys {sorted(x)}. Rename the children or the input keys so "
            "they match."
        )


class Sequential(AbstractReplayEnvs):
    """Chains layers: the output of layer `i` is the input of layer `i + 1`.

    State, extras and metrics are dicts keyed by the integer position of each
    layer: `{0: ..., 1: ...}`.

    **Arguments:**

    - `layers`: a non-empty sequence of stateful modules.

    ```python
    net = Sequential([Dense(4, 8, key=k1, activation="relu"), Dense(8, 2, key=k2)])
    out = net(net.initial_state(), x, key=key)
    ```
    """

    layers: tuple[AbstractStatefulModule, ...]

    def __init__(self, layers: Iterable[AbstractStatefulModule]):
        if isinstance(layers, AbstractStatefulModule | Mapping):
            fix = (
                "for named children use Parallel, Concat, Map or Merge"
                if isinstance(layers, Mapping)
                else "pass Sequential([layer])"
            )
            raise TypeError(
                "`Sequential` takes a list of layers, got a single "
                f"{type(layers).__name__}; {fix}."
            )
        layers = tuple(layers)
        if not layers:
            raise ValueError(
                "`Sequential([])` needs at least one layer, got an empty sequence; "
                "pass e.g. `Sequential([layer_a, layer_b])`."
            )
        for i, layer in enumerate(layers):
            if not isinstance(layer, AbstractStatefulModule):
                raise TypeError(
                    f"`Sequential`: layer {i} must be an AbstractStatefulModule, got "
                    f"{type(layer).__name__}."
                )
        self.layers = layers

    def __getitem__(self, index: int) -> AbstractStatefulModule:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def uses_key(self) -> bool:
        return any(layer.uses_key for layer in self.layers)

    def __call__(
        self,
        state: dict[int, State],
        x: Any,
        extras: dict[int, Any] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        _check_state("Sequential", state, range(len(self.layers)))
        extras = _child_extras(extras, range(len(self.layers)))
        keys = route_keys(key, self.layers)
        outs = {}
        for i, (layer, layer_key) in enumerate(zip(self.layers, keys, strict=True)):
            outs[i] = checked_output(
                layer, state[i], layer(state[i], x, extras[i], key=layer_key)
            )
            x = outs[i].output
        return _gather(outs, x)

    def replay_envs(
        self,
        state0: dict[int, State],
        xs: Any,
        extras: dict[int, Any] | None,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        check_env_batch(type(self).__name__, xs, extras, keys, done)
        extras = _child_extras(extras, range(len(self.layers)))
        layer_keys = route_sequence_keys(keys, self.layers)
        outs = {}
        for i, (layer, layer_key) in enumerate(
            zip(self.layers, layer_keys, strict=True)
        ):
            outs[i] = layer.replay_envs(state0[i], xs, extras[i], layer_key, done)
            xs = outs[i].output
        return _gather_sequences(outs, xs, done)

    def initial_state(self) -> dict[int, State]:
        return {i: layer.initial_state() for i, layer in enumerate(self.layers)}

    def reset_state(self, prev_state: dict[int, State]) -> dict[int, State]:
        return {
            i: layer.reset_state(prev_state[i]) for i, layer in enumerate(self.layers)
        }

    def update_statistics(self, extras: dict[int, Any] | None) -> "Sequential":
        extras = _child_extras(extras, range(len(self.layers)))
        return type(self)(
            layer.update_statistics(extras[i]) for i, layer in enumerate(self.layers)
        )


class AbstractChildDict(AbstractReplayEnvs):
    """A module over a dict of named children, run side by side.

    Subclasses name the children (`_children`, in key order), choose each
    child's input with `_child_inputs` (by default every child gets `x`) and
    one step's output with `_combine`; the call, the sequence replay, the
    carries and the statistics update share them. State, extras and metrics
    are dicts by child name.
    """

    @property
    @abc.abstractmethod
    def _children(self) -> dict[str, AbstractStatefulModule]:
        """The children by name, in the order they are run and get keys."""

    @abc.abstractmethod
    def _with_children(
        self, children: dict[str, AbstractStatefulModule]
    ) -> "AbstractChildDict":
        """A copy of this module with `children` in place of its own."""

    def _child_inputs(self, x: Any) -> dict[str, Any]:
        """Each child's input, by name; structural, so it works on sequences."""
        return {name: x for name in self._children}

    def _combine(self, outputs: dict[str, Any]) -> Any:
        """One step's output from the children's outputs."""
        return outputs

    @property
    def uses_key(self) -> bool:
        return any(child.uses_key for child in self._children.values())

    def __call__(
        self,
        state: dict[str, State],
        x: Any,
        extras: dict[str, Any] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        children = self._children
        _check_state(type(self).__name__, state, children)
        out = _run_children(children, state, self._child_inputs(x), extras, key)
        return out._replace(output=self._combine(out.output))

    def replay_envs(
        self,
        state0: dict[str, State],
        xs: Any,
        extras: dict[str, Any] | None,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        check_env_batch(type(self).__name__, xs, extras, keys, done)
        out = _replay_children(
            self._children, state0, self._child_inputs(xs), extras, keys, done
        )
        return out._replace(output=jax.vmap(jax.vmap(self._combine))(out.output))

    def initial_state(self) -> dict[str, State]:
        return {name: child.initial_state() for name, child in self._children.items()}

    def reset_state(self, prev_state: dict[str, State]) -> dict[str, State]:
        return {
            name: child.reset_state(prev_state[name])
            for name, child in self._children.items()
        }

    def update_statistics(self, extras: dict[str, Any] | None) -> "AbstractChildDict":
        children = self._children
        extras = _child_extras(extras, children)
        return self._with_children(
            {
                name: child.update_statistics(extras[name])
                for name, child in children.items()
            }
        )


class _AbstractNamedContainer(AbstractChildDict):
    """Children stored in a dict sorted by name; built from a dict or keywords."""

    modules: dict[str, AbstractStatefulModule]

    def __init__(
        self,
        modules: Mapping[str, AbstractStatefulModule] | None = None,
        /,
        **kwargs: AbstractStatefulModule,
    ):
        self.modules = _named_children(type(self).__name__, modules, kwargs)

    def __getitem__(self, name: str) -> AbstractStatefulModule:
        return self.modules[name]

    @property
    def _children(self) -> dict[str, AbstractStatefulModule]:
        return self.modules

    def _with_children(
        self, children: dict[str, AbstractStatefulModule]
    ) -> "_AbstractNamedContainer":
        return type(self)(children)


class Parallel(_AbstractNamedContainer):
    """Runs every child on the same input; the output is a dict keyed by name.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children. Use the
      dict form when a name is not a Python identifier.

    ```python
    heads = Parallel(policy=Dense(8, 4, key=k1), value=Dense(8, 1, key=k2))
    out = heads(heads.initial_state(), features)  # out.output["policy"], ["value"]
    ```
    """


class Map(_AbstractNamedContainer):
    """Per-key dispatch: child `k` maps `x[k]` to `output[k]`.

    The input must be a dict holding at least every child's name; entries no
    child is named after are dropped. Typical use: one action sampler per
    action key, `Map(arm=NormalTanhSampler(...), gripper=CategoricalSampler(...))`.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _child_inputs(self, x: Any) -> dict[str, Any]:
        _check_has_keys("Map", x, self.modules)
        return dict(x)


class Concat(_AbstractNamedContainer):
    """Per-key dispatch, then concatenation along the last axis.

    Child `k` sees `x[k]`; the outputs are concatenated in **sorted key order**
    (e.g. `Concat(vision=..., proprio=...)` puts `proprio` first), the same
    eagerly and under `jit`. Entries of `x` no child is named after are dropped.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children; each must
      output an array with at least one axis.
    """

    def _child_inputs(self, x: Any) -> dict[str, Any]:
        _check_has_keys("Concat", x, self.modules)
        return dict(x)

    def _combine(self, outputs: dict[str, Any]) -> Array:
        for name, value in outputs.items():
            if jnp.ndim(value) == 0:
                raise ValueError(
                    f"`Concat`: child {name!r} returned a scalar; concatenation "
                    "along the last axis needs outputs with at least one axis. "
                    "Reshape it to `(1,)` first."
                )
        return jnp.concatenate([outputs[name] for name in self.modules], axis=-1)


class Merge(_AbstractNamedContainer):
    """Runs every child on the same input and merges their dict outputs.

    Each child must return a dict; the result is one flat dict. Two children
    producing the same key is an error. State, extras and metrics stay keyed by
    child name.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _combine(self, outputs: dict[str, Any]) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        producer: dict[Any, str] = {}
        for name, out in outputs.items():
            if not isinstance(out, Mapping):
                raise TypeError(
                    f"`Merge`: child {name!r} must return a dict, got "
                    f"{type(out).__name__}; put a `Splitter` or `Parallel` at its end."
                )
            for out_key, value in out.items():
                if out_key in merged:
                    raise ValueError(
                        f"`Merge`: children {producer[out_key]!r} and {name!r} both "
                        f"produce the key {out_key!r}; rename one of the outputs."
                    )
                merged[out_key] = value
                producer[out_key] = name
        return merged
