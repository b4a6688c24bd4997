"""Containers: compose stateful modules into one.

Every container routes the five per-call channels the same way:

- `state`, `extras` and `metrics` are dicts keyed like the children: integer
  positions for [`eqx_ppo.nn.Sequential`][], the child names for the named
  containers. `extras=None` hands `None` to every child.
- The regularisation losses of the children are summed.
- `replay` routes a `[T, M]` batch child by child with the same code as a
  call routes one step, so in the loss replay only recurrent children are
  scanned over time, and the others run once over all the minibatch's steps.
- Child `i` of `Sequential` gets the key `jax.random.fold_in(key, i)`, the
  child named `name` of a named container `fold_in(key, crc32(name))`, and
  a layer inside a nested container one fold by its whole path
  (`_keys.child_key`): its own key, whatever its siblings are, the same
  eagerly, under `jit` and in the loss replay.

**Child order.** Named containers store their children sorted by name. JAX
flattens dicts in sorted-key order, so this is the only order that survives a
round trip through `jax.tree_util` unchanged (under `jit`, `vmap` or
`tree_map`); using it everywhere means that `Concat`'s output layout does not
depend on how the container was built or transformed.
"""

import abc
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Key

from .._typecheck import checked
from ._keys import child_key
from ._module import (
    AbstractLayerWrapper,
    AbstractStatefulModule,
    SequenceOutput,
    State,
    StatefulModuleOutput,
    checked_output,
    zero_loss,
)

Run = Callable[[Hashable, Any], Any]
"""Runs one child, by name, on its input and returns the child's output."""

PerStep = Callable[[Callable], Callable]
"""Lifts a function of one step's outputs to what a call or a replay produces."""


def _one_step(f: Callable) -> Callable:
    return f


def _every_step(f: Callable) -> Callable:
    return jax.vmap(jax.vmap(f))


def _child(extras: Any, name: Hashable) -> Any:
    return None if extras is None else extras[name]


class _AbstractContainer(AbstractStatefulModule):
    """A module over children: the call, the replay, the carries and the
    statistics update, all routed by `_route`.

    A subclass names its children (`_children`, in the order they run),
    builds a copy with other children (`_with_children`), and
    says how an input flows through them (`_route`). The call and the replay
    share `_route`, so a `[T, M]` batch is routed exactly as one step is.
    """

    @abc.abstractmethod
    def _children(self) -> dict[Hashable, AbstractStatefulModule]:
        """The children by name or position, in the order they run."""

    @abc.abstractmethod
    def _with_children(
        self, children: dict[Hashable, AbstractStatefulModule]
    ) -> "_AbstractContainer":
        """A copy of this container with `children` in place of its own."""

    @abc.abstractmethod
    def _route(self, run: Run, x: Any, per_step: PerStep) -> Any:
        """The container's output for input `x`: `run(name, input)` runs a
        child (each exactly once, in `_children`'s order) and returns its
        output. Code that combines outputs of one step goes through
        `per_step`, since in a replay every output has `[T, M]` axes."""

    def __check_init__(self):
        if not self._children():
            raise ValueError(
                f"`{type(self).__name__}()` needs at least one child module, got none."
            )

    def __call__(
        self,
        state: dict[Hashable, State],
        x: Any,
        extras: dict[Hashable, Any] | None = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        return _Routed(self, ())(state, x, extras, key=key)

    def replay(
        self,
        state0: dict[Hashable, State],
        xs: Any,
        extras: dict[Hashable, Any] | None,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        return _Routed(self, ()).replay(state0, xs, extras, keys, done)

    def initial_state(self) -> dict[Hashable, State]:
        return {name: child.initial_state() for name, child in self._children().items()}

    def reset_state(self, prev_state: dict[Hashable, State]) -> dict[Hashable, State]:
        return {
            name: child.reset_state(prev_state[name])
            for name, child in self._children().items()
        }

    def update_statistics(
        self, extras: dict[Hashable, Any] | None
    ) -> "_AbstractContainer":
        return self._with_children(
            {
                name: child.update_statistics(_child(extras, name))
                for name, child in self._children().items()
            }
        )


class _Routed(AbstractStatefulModule):
    """A container's call and replay at `path` below the container that was
    given the key: its layers get that key folded by their whole path."""

    container: _AbstractContainer
    path: tuple[Hashable, ...] = eqx.field(static=True)

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        children = self.container._children()
        outs: dict[Hashable, StatefulModuleOutput] = {}

        def run(name: Hashable, child_x: Any) -> Any:
            child = children[name]
            module, child_keys = _at(child, (*self.path, name), key)
            out = module(state[name], child_x, _child(extras, name), key=child_keys)
            outs[name] = checked_output(child, state[name], out)
            return out.output

        output = self.container._route(run, x, _one_step)
        return StatefulModuleOutput(
            next_state={name: out.next_state for name, out in outs.items()},
            output=output,
            regularization_loss=sum(
                (out.regularization_loss for out in outs.values()), zero_loss()
            ),
            metrics={name: out.metrics for name, out in outs.items()},
            extras={name: out.extras for name, out in outs.items()},
        )

    def replay(self, state0, xs, extras, keys, done) -> SequenceOutput:
        children = self.container._children()
        outs: dict[Hashable, SequenceOutput] = {}

        def run(name: Hashable, child_xs: Any) -> Any:
            module, child_keys = _at(children[name], (*self.path, name), keys)
            outs[name] = module.replay(
                state0[name], child_xs, _child(extras, name), child_keys, done
            )
            return outs[name].output

        output = self.container._route(run, xs, _every_step)
        return SequenceOutput(
            last_state={name: out.last_state for name, out in outs.items()},
            output=output,
            regularization_loss=sum(
                (out.regularization_loss for out in outs.values()),
                jnp.zeros(done.shape, jnp.float32),
            ),
        )

    def initial_state(self) -> State:
        return self.container.initial_state()

    def reset_state(self, prev_state: State) -> State:
        return self.container.reset_state(prev_state)


def _at(child: AbstractStatefulModule, path: tuple[Hashable, ...], key: Any):
    """What runs `child` at `path`, and the key (or keys) it takes: a
    container, or a wrapper of one, takes its parent's and routes the path on;
    any other layer gets its own fold."""
    routed = _routed(child, path)
    return (child, child_key(key, path)) if routed is None else (routed, key)


def _routed(child: AbstractStatefulModule, path: tuple[Hashable, ...]) -> Any:
    """`child` at `path`, taking its parent's key, if it is a container or
    wraps one (its wrappers run as they are, around the routed container);
    `None` for a layer, which gets its own key."""
    if isinstance(child, _AbstractContainer):
        return _Routed(child, path)
    if isinstance(child, AbstractLayerWrapper):
        inner = _routed(child.layer, path)
        if inner is not None:
            return eqx.tree_at(lambda wrapper: wrapper.layer, child, inner)
    return None


class _AbstractNamedContainer(_AbstractContainer):
    """Children by name, given as a dict or as keywords, stored sorted by name;
    a subclass says how they are routed (`_route`)."""

    modules: dict[str, AbstractStatefulModule]

    def __init__(
        self,
        modules: Mapping[str, AbstractStatefulModule] | None = None,
        /,
        **kwargs: AbstractStatefulModule,
    ):
        if modules is not None and kwargs:
            name = type(self).__name__
            raise ValueError(
                f"`{name}(...)` got both a positional dict and keyword arguments; "
                f"pass the children one way, e.g. `{name}(a=module_a, b=module_b)` "
                f'or `{name}({{"a": module_a, "b": module_b}})`.'
            )
        children = kwargs if modules is None else modules
        self.modules = {name: children[name] for name in sorted(children)}

    def __getitem__(self, name: str) -> AbstractStatefulModule:
        return self.modules[name]

    def _children(self) -> dict[str, AbstractStatefulModule]:
        return self.modules

    def _with_children(
        self, children: dict[str, AbstractStatefulModule]
    ) -> "_AbstractNamedContainer":
        return type(self)(children)


def _dispatch(container: "Map | Concat", x: Any) -> dict[str, Any]:
    """`x[name]` for every child name: what a per-key container feeds them."""
    names = list(container.modules)
    if not isinstance(x, Mapping) or any(name not in x for name in names):
        seen = f"keys {sorted(x)}" if isinstance(x, Mapping) else type(x).__name__
        raise ValueError(
            f"`{type(container).__name__}` feeds child `k` the entry `x[k]` of a "
            "dict input, so "
            f"it needs a dict with keys {names}; got {seen}. Rename the children "
            "or the input keys so they match."
        )
    return {name: x[name] for name in names}


@checked
class Sequential(_AbstractContainer):
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

    def __init__(self, layers: Sequence[AbstractStatefulModule]):
        self.layers = tuple(layers)

    def __getitem__(self, index: int) -> AbstractStatefulModule:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def _children(self) -> dict[int, AbstractStatefulModule]:
        return dict(enumerate(self.layers))

    def _with_children(
        self, children: dict[int, AbstractStatefulModule]
    ) -> "Sequential":
        return Sequential(list(children.values()))

    def _route(self, run: Run, x: Any, per_step: PerStep) -> Any:
        for i in range(len(self.layers)):
            x = run(i, x)
        return x


@checked
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

    def _route(self, run: Run, x: Any, per_step: PerStep) -> dict[str, Any]:
        return {name: run(name, x) for name in self.modules}


@checked
class Map(_AbstractNamedContainer):
    """Per-key dispatch: child `k` maps `x[k]` to `output[k]`.

    The input must be a dict holding at least every child's name; entries no
    child is named after are dropped. Typical use: one action sampler per
    action key, `Map(arm=NormalTanhSampler(...), gripper=CategoricalSampler(...))`.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> dict[str, Any]:
        inputs = _dispatch(self, x)
        return {name: run(name, inputs[name]) for name in self.modules}


def _concatenate(outputs: dict[str, Array]) -> Array:
    return jnp.concatenate(list(outputs.values()), axis=-1)


@checked
class Concat(_AbstractNamedContainer):
    """Per-key dispatch, then concatenation along the last axis.

    Child `k` sees `x[k]`; the outputs are concatenated in **sorted key order**
    (e.g. `Concat(vision=..., proprio=...)` puts `proprio` first), the same
    eagerly and under `jit`. Entries of `x` no child is named after are dropped.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children; each must
      output an array with at least one axis.
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> Array:
        inputs = _dispatch(self, x)
        outputs = {name: run(name, inputs[name]) for name in self.modules}
        return per_step(_concatenate)(outputs)


def _merge(outputs: dict[str, Any]) -> dict[Any, Any]:
    merged: dict[Any, Any] = {}
    producer: dict[Any, str] = {}
    for name, out in outputs.items():
        for out_key, value in out.items():
            if out_key in merged:
                raise ValueError(
                    f"`Merge`: children {producer[out_key]!r} and {name!r} both "
                    f"produce the key {out_key!r}; rename one of the outputs."
                )
            merged[out_key] = value
            producer[out_key] = name
    return merged


@checked
class Merge(_AbstractNamedContainer):
    """Runs every child on the same input and merges their dict outputs.

    Each child must return a dict; the result is one flat dict. Two children
    producing the same key is an error. State, extras and metrics stay keyed by
    child name.

    **Arguments:**

    - `modules` (positional-only) or `**kwargs`: the named children.
    """

    def _route(self, run: Run, x: Any, per_step: PerStep) -> dict[Any, Any]:
        outputs = {name: run(name, x) for name in self.modules}
        return per_step(_merge)(outputs)
