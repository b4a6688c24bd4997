"""Activation recording: every leaf layer reports its output in its metrics,
under `ACTIVATION_KEY`, and the containers carry the metrics up. See the
recording guide.
"""

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import jax
from jaxtyping import PyTree

from ._typecheck import checked
from .graph import PopulationGraph
from .graph._graph import ACTIVATION_KEY as ACTIVATION_KEY
from .nn._module import (
    AbstractLayerWrapper,
    AbstractStatefulModule,
    StatefulModuleOutput,
)


class Recorder(AbstractLayerWrapper):
    """Runs `layer` unchanged and adds its output to its metrics under
    `ACTIVATION_KEY`; a replay returns no metrics, so the layer's own replay
    runs unchanged. [`eqx_ppo.with_recording`][] wraps every leaf layer in one.
    """

    layer: AbstractStatefulModule

    def wrap_output(self, out: StatefulModuleOutput) -> StatefulModuleOutput:
        return out._replace(metrics={**out.metrics, ACTIVATION_KEY: out.output})


def is_leaf_layer(node: Any) -> bool:
    """Whether `node` is a stateful module with no stateful module anywhere in
    its pytree children (so containers of your own are seen through)."""
    if not isinstance(node, AbstractStatefulModule):
        return False
    children = jax.tree.leaves(
        node, is_leaf=lambda n: n is not node and isinstance(n, AbstractStatefulModule)
    )
    return not any(isinstance(c, AbstractStatefulModule) for c in children)


def is_recording(net: PyTree) -> bool:
    """Whether `net` already records: it holds a `Recorder` or a recording graph."""
    is_node = lambda n: isinstance(n, Recorder | PopulationGraph)  # noqa: E731
    nodes = jax.tree.leaves(net, is_leaf=is_node)
    return any(isinstance(n, Recorder) or (is_node(n) and n.record) for n in nodes)


@checked
def with_recording(net: PyTree) -> PyTree:
    """A copy of `net` whose every leaf layer (see
    [`eqx_ppo.recording.is_leaf_layer`][]) is wrapped in a [`eqx_ppo.Recorder`][],
    and every [`eqx_ppo.graph.PopulationGraph`][] has `record=True`; parameters
    are shared and outputs unchanged. A network that already records is returned
    as it is, with a warning. Read the activations with
    [`eqx_ppo.extract_activations`][].
    """
    if is_recording(net):
        warnings.warn(
            "with_recording(net): `net` already records activations (it contains "
            "a Recorder or a PopulationGraph with record=True); returning it "
            "unchanged.",
            UserWarning,
            stacklevel=2,
        )
        return net

    def is_target(node: Any) -> bool:
        # Graphs come first: one with no connections would also pass as a leaf.
        return isinstance(node, PopulationGraph) or is_leaf_layer(node)

    def record(node: Any) -> Any:
        if isinstance(node, PopulationGraph):
            return dataclasses.replace(node, record=True)
        return Recorder(node) if is_leaf_layer(node) else node

    if not any(map(is_target, jax.tree.leaves(net, is_leaf=is_target))):
        fix = "call the factory first" if callable(net) else "pass a network"
        raise TypeError(
            f"with_recording(net=<{type(net).__name__}>): found no layer to record. "
            f"Fix: {fix}, e.g. with_recording(make_mlp_actor_critic(..., key=key))."
        )
    return jax.tree.map(record, net, is_leaf=is_target)


@checked
def extract_activations(metrics: Mapping | None) -> PyTree | None:
    """The recorded activations in a recording network's `metrics` (of any
    leading shape), as a nested dict mirroring the network (the recording guide
    gives its keys); `None` if there are none."""
    return _activations_in(metrics)


def _activations_in(metrics: Any) -> PyTree | None:
    if not isinstance(metrics, Mapping):
        return None
    if ACTIVATION_KEY in metrics:
        return metrics[ACTIVATION_KEY]
    found = {name: _activations_in(sub) for name, sub in metrics.items()}
    return {name: a for name, a in found.items() if a is not None} or None
