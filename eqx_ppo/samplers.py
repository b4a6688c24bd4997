"""Action samplers: distribution parameters in, an action and its log-likelihood out.

Without `extras` a sampler samples and emits the action as `extras`; given
them (the loss replay) it scores that stored action. The contract is the
guide's "Writing a sampler" (docs/guides/custom-layer.md).
"""

import abc
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Integer, Key

from ._typecheck import Int, check_range, checked, each
from .nn._filters import coefficient
from .nn._keys import check_draws
from .nn._module import AbstractStatefulModule, StatefulModuleOutput

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def _entropy(log_probs: Float[Array, " n"]) -> Float[Array, ""]:
    """`-sum(p log p)`, with `0 log 0 = 0` for a masked (`-inf`) choice, in the
    value and in the gradient."""
    finite = jnp.where(log_probs > -jnp.inf, log_probs, 0.0)
    return -jnp.sum(jnp.exp(log_probs) * finite)


_Vec = Float[Array, " action"]
"""One value per action dimension: a mean, a std or a pre-squash action."""


def _normal_logpdf(z: _Vec, mean: _Vec, std: _Vec) -> _Vec:
    return -0.5 * jnp.square((z - mean) / std) - (0.5 * _LOG_2PI + jnp.log(std))


def _normal_entropy(std: _Vec) -> _Vec:
    return 0.5 + 0.5 * _LOG_2PI + jnp.log(std)


def _tanh_log_det(z: _Vec) -> _Vec:
    """`log(1 - tanh(z)^2)`, written so it neither overflows nor hits `log(0)`."""
    return 2.0 * (_LOG_2 - z - jax.nn.softplus(-2.0 * z))


_Step = tuple[Array, Array, Float[Array, ""], Float[Array, ""], dict[str, Array]]
"""One sampler call: the action, its extras, log-likelihood, entropy, metrics."""


class _AbstractSampler(AbstractStatefulModule):
    """The call every sampler shares: it checks the key, lets `_sample` draw or
    score the action, and packages a sampler dict with the entropy bonus."""

    entropy_weight: eqx.AbstractVar[Float[Array, ""]]
    inference: eqx.AbstractVar[bool]

    @abc.abstractmethod
    def _sample(
        self, x: Array, extras: Array | None, key: Key[Array, ""] | None
    ) -> _Step:
        """A fresh action if `extras` is `None`, else the stored one, scored."""

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del state
        check_draws(self, key)
        action, extras, log_likelihood, entropy, metrics = self._sample(x, extras, key)
        output = {"action": action, "log_likelihood": log_likelihood}
        loss = -self.entropy_weight * entropy
        return StatefulModuleOutput((), output, loss, metrics, extras)


class _AbstractGaussianSampler(_AbstractSampler):
    """A Gaussian over actions from one env's `[mean, pre_std]`, with
    `std = (softplus(pre_std) + min_std) * std_scale`; `_draw` samples or
    scores the action."""

    entropy_weight: Float[Array, ""] = coefficient(nonnegative=True)
    min_std: float = eqx.field(static=True, default=1e-3)
    std_scale: float = eqx.field(static=True, default=1.0)
    inference: bool = False

    def __check_init__(self):
        name = type(self).__name__
        check_range(f"{name}(min_std=", self.min_std, 0)
        check_range(f"{name}(std_scale=", self.std_scale, 0, open_low=True)

    @abc.abstractmethod
    def _draw(
        self, mean: _Vec, std: _Vec, extras: _Vec | None, key: Key[Array, ""] | None
    ) -> tuple[_Vec, _Vec, Float[Array, ""], Float[Array, ""]]:
        """The action, its extras, its log-likelihood and the entropy."""

    def _sample(
        self,
        x: Float[Array, " params"],
        extras: _Vec | None,
        key: Key[Array, ""] | None,
    ) -> _Step:
        if x.ndim != 1 or x.shape[0] % 2 != 0:
            raise ValueError(
                f"`{type(self).__name__}` expects one env's concatenated "
                "`[mean, pre_std]`, a vector of even size 2 * action_size, got "
                f"shape {x.shape}; make the layer before it output "
                "2 * action_size features."
            )
        mean, pre_std = jnp.split(x, 2)
        std = (jax.nn.softplus(pre_std) + self.min_std) * self.std_scale
        return *self._draw(mean, std, extras, key), {"mu": mean, "sigma": std}


@checked
class NormalTanhSampler(_AbstractGaussianSampler):
    """A Gaussian over one env's `[mean, pre_std]`, squashed by `tanh`: actions
    in `(-1, 1)`, `extras` the pre-`tanh` sample, metrics `mu` and `sigma`.
    The entropy is a one-sample estimate (see the Samplers section of the API).

    **Arguments:**

    - `entropy_weight`: weight of the entropy bonus (traced, never trained).
    - `min_std`: floor added to `softplus(pre_std)`, `>= 0`.
    - `std_scale`: multiplier of the std after the floor, `> 0`.
    - `inference`: act deterministically; set it with `eqx.nn.inference_mode`.
    """

    def _draw(
        self, mean: _Vec, std: _Vec, extras: _Vec | None, key: Key[Array, ""] | None
    ) -> tuple[_Vec, _Vec, Float[Array, ""], Float[Array, ""]]:
        if key is None:
            action_noise = entropy_noise = jnp.zeros_like(mean)
        else:
            action_noise, entropy_noise = jax.random.normal(key, (2, *mean.shape))
        sampled = mean if self.inference else mean + std * action_noise
        raw = jax.lax.stop_gradient(sampled if extras is None else extras)
        log_likelihood = jnp.sum(_normal_logpdf(raw, mean, std) - _tanh_log_det(raw))

        z = mean + std * jax.lax.stop_gradient(entropy_noise)
        entropy = jnp.sum(_normal_entropy(std) + _tanh_log_det(z))
        return jnp.tanh(raw), raw, log_likelihood, entropy


@checked
class NormalSampler(_AbstractGaussianSampler):
    """An unsquashed Gaussian, `action = mean + std * eps` (also its `extras`),
    with the exact entropy; otherwise as [`eqx_ppo.nn.NormalTanhSampler`][],
    whose arguments it takes."""

    def _draw(
        self, mean: _Vec, std: _Vec, extras: _Vec | None, key: Key[Array, ""] | None
    ) -> tuple[_Vec, _Vec, Float[Array, ""], Float[Array, ""]]:
        sampled = (
            mean if self.inference else mean + std * jax.random.normal(key, mean.shape)
        )
        action = jax.lax.stop_gradient(sampled if extras is None else extras)
        log_likelihood = jnp.sum(_normal_logpdf(action, mean, std))
        return action, action, log_likelihood, jnp.sum(_normal_entropy(std))


@checked
class CategoricalSampler(_AbstractSampler):
    """Discrete actions from logits: an integer in `[0, n)` for `n_actions=n`;
    for a tuple `(n1, n2, ...)`, one per group of logits, log-likelihoods and
    entropies summed. `extras` is the action; metric `entropy`.

    **Arguments:**

    - `entropy_weight`: weight of the entropy bonus (traced, never trained).
    - `n_actions`: the number of categories, or a tuple of them (multi-discrete).
    - `inference`: act deterministically (arg-max); see `eqx.nn.inference_mode`.
    """

    entropy_weight: Float[Array, ""] = coefficient(nonnegative=True)
    n_actions: Int | each(tuple, Int) = eqx.field(static=True)
    inference: bool = False

    def __check_init__(self):
        if min(self._group_sizes(), default=0) < 1:
            raise ValueError(
                f"`CategoricalSampler(n_actions={self.n_actions!r})`: n_actions must "
                "be a positive int or a non-empty tuple of positive ints."
            )

    def _group_sizes(self) -> tuple[int, ...]:
        n = self.n_actions
        return n if isinstance(n, tuple) else (n,)

    def _sample(
        self,
        x: Float[Array, " logits"],
        extras: Integer[Array, "*subactions"] | None,
        key: Key[Array, ""] | None,
    ) -> _Step:
        sizes = self._group_sizes()
        if x.shape != (sum(sizes),):
            raise ValueError(
                f"`CategoricalSampler(n_actions={self.n_actions!r})` expects "
                f"{sum(sizes)} logits, got shape {x.shape}; make the layer before it "
                f"output {sum(sizes)} features."
            )
        split_at = [sum(sizes[:i]) for i in range(1, len(sizes))]
        log_probs = [jax.nn.log_softmax(group) for group in jnp.split(x, split_at)]
        if self.inference:
            sampled = [jnp.argmax(lp) for lp in log_probs]
        else:
            keys = jax.random.split(key, len(sizes))
            sampled = [
                jax.random.categorical(k, lp)
                for k, lp in zip(keys, log_probs, strict=True)
            ]
        sampled_action = (
            sampled[0] if isinstance(self.n_actions, int) else jnp.stack(sampled)
        )
        action = sampled_action if extras is None else extras
        sub_actions = jnp.atleast_1d(action)
        # A masked sum, not `lp[a]`: under vmap indexing is a gather whose
        # gradient is a scatter, which a TPU runs as a loop over every step
        # (and not a one-hot matmul, which a TPU rounds to bfloat16).
        log_likelihood = sum(
            jnp.sum(jnp.where(jnp.arange(lp.shape[0]) == a, lp, 0.0))
            for lp, a in zip(log_probs, sub_actions, strict=True)
        )
        entropy = sum(_entropy(lp) for lp in log_probs)
        return action, action, log_likelihood, entropy, {"entropy": entropy}
