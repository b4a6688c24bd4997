"""Variational bottlenecks: a reparameterised Gaussian latent with a KL prior
penalty, and a variant that also penalises jumps between consecutive samples."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from .._typecheck import checked
from ._dense import kernel_and_bias
from ._errors import check_input
from ._filters import coefficient
from ._keys import check_draws
from ._module import AbstractStatefulModule, StatefulModuleOutput


class GaussianHead(eqx.Module):
    """The projection `x -> (mu, std)` and the sample, shared by both
    bottlenecks: a plain Equinox module, so they stay leaf layers. Initialised
    as a `Dense`; columns `[:latent_size]` give `mu`, the rest `pre_std`."""

    kernel: Float[Array, "in_size two_latent"]
    bias: Float[Array, " two_latent"]
    min_std: float = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    latent_size: int = eqx.field(static=True)

    def __init__(
        self, in_size: int, latent_size: int, min_std: float, key: Key[Array, ""]
    ):
        if not min_std > 0:
            raise ValueError(
                f"min_std={min_std} must be > 0, so that log(std) stays finite."
            )
        self.kernel, self.bias = kernel_and_bias(key, (in_size, 2 * latent_size))
        self.min_std = float(min_std)
        self.in_size = in_size
        self.latent_size = latent_size

    def __call__(
        self, layer: Any, x: Any, key: Key[Array, ""] | None
    ) -> tuple[Float[Array, " latent"], dict[str, Float[Array, "..."]]]:
        """The sample of the bottleneck `layer` (`mu` if `layer.inference`)
        and the metrics `mu`, `sigma`, `kl`; errors name `layer`."""
        check_input(layer, x, (self.in_size,))
        check_draws(layer, key)
        mu, pre_std = jnp.split(x @ self.kernel + self.bias, 2)
        std = jax.nn.softplus(pre_std) + self.min_std
        if layer.inference:
            z = mu
        else:
            z = mu + std * jax.random.normal(key, mu.shape, mu.dtype)
        kl = 0.5 * jnp.sum(jnp.square(mu) + jnp.square(std) - 2 * jnp.log(std) - 1)
        return z, {"mu": mu, "sigma": std, "kl": kl}


@checked
class VariationalBottleneck(AbstractStatefulModule):
    """A Gaussian latent `z = mu + std * eps`, `eps ~ N(0, I)` drawn from `key`.

    A linear projection (`head`, initialised as a [`eqx_ppo.nn.Dense`][])
    gives `(mu, pre_std)` and `std = softplus(pre_std) + min_std`; the loss
    replay (same key) reproduces the noise and differentiates through it.
    The regularisation loss is `kl_weight * KL(N(mu, std^2) || N(0, I))`,
    the metrics `mu`, `sigma` (the std) and `kl`. In inference mode
    (`eqx.nn.inference_mode`) the output is `mu` and no key is needed.
    """

    head: GaussianHead
    kl_weight: Float[Array, ""] = coefficient(nonnegative=True)
    inference: bool = False

    def __init__(
        self,
        in_size: int,
        latent_size: int,
        *,
        key: Key[Array, ""],
        kl_weight: float | Float[Array, ""] = 1.0,
        min_std: float = 1e-6,
        inference: bool = False,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `latent_size`: size of the sample `z`.
        - `key`: PRNG key for the projection's initialisation.
        - `kl_weight`: weight of the KL penalty in the regularisation loss.
        - `min_std`: added to the softplus, so that `log(std)` stays finite.
        - `inference`: output `mu` instead of a sample.
        """
        self.head = GaussianHead(in_size, latent_size, min_std, key)
        self.kl_weight = kl_weight
        self.inference = inference

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del state, extras
        z, metrics = self.head(self, x, key)
        loss = self.kl_weight * metrics["kl"]
        return StatefulModuleOutput((), z, loss, metrics, None)


@checked
class AR1VariationalBottleneck(AbstractStatefulModule):
    """A [`eqx_ppo.nn.VariationalBottleneck`][] that also penalises latent jumps.

    As in nnx-ppo, it adds `ar1_weight * mean((z_t - z_{t-1})^2)`, reported
    unweighted as the metric `l2_diff`. The carry holds the previous sample
    and a `valid` flag: at an episode start the penalty is exactly 0. Unlike
    nnx-ppo's, by default the previous sample is a constant, so the penalty
    pulls `z_t` towards `z_{t-1}`, not the other way.
    """

    head: GaussianHead
    kl_weight: Float[Array, ""] = coefficient(nonnegative=True)
    ar1_weight: Float[Array, ""] = coefficient(nonnegative=True)
    backprop_through_time: bool = eqx.field(static=True)
    inference: bool = False

    def __init__(
        self,
        in_size: int,
        latent_size: int,
        *,
        key: Key[Array, ""],
        kl_weight: float | Float[Array, ""] = 1.0,
        min_std: float = 1e-6,
        ar1_weight: float | Float[Array, ""] = 1.0,
        backprop_through_time: bool = False,
        inference: bool = False,
    ):
        """**Arguments:**

        - `in_size`, `latent_size`, `key`, `kl_weight`, `min_std`,
            `inference`: as in [`eqx_ppo.nn.VariationalBottleneck`][].
        - `ar1_weight`: weight of the smoothness penalty.
        - `backprop_through_time`: let the penalty's gradient flow into the
            previous step's sample as well.
        """
        self.head = GaussianHead(in_size, latent_size, min_std, key)
        self.kl_weight = kl_weight
        self.ar1_weight = ar1_weight
        self.backprop_through_time = backprop_through_time
        self.inference = inference

    def initial_state(self) -> dict[str, Any]:
        """`{"prev": zeros, "valid": False}`: no previous sample yet."""
        return {
            "prev": jnp.zeros(self.head.latent_size, jnp.float32),
            "valid": jnp.zeros((), bool),
        }

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del extras
        z, metrics = self.head(self, x, key)
        prev, valid = state["prev"], state["valid"]
        if not self.backprop_through_time:
            prev = jax.lax.stop_gradient(prev)
        # Inner where: an invalid (possibly NaN) prev never enters the
        # arithmetic, so its gradient is exactly 0. Outer where: no penalty.
        safe_prev = jnp.where(valid, prev, jax.lax.stop_gradient(z))
        l2_diff = jnp.where(valid, jnp.mean(jnp.square(z - safe_prev)), 0.0)
        next_state = {"prev": z, "valid": jnp.ones((), bool)}
        loss = self.kl_weight * metrics["kl"] + self.ar1_weight * l2_diff
        metrics = {**metrics, "l2_diff": l2_diff}
        return StatefulModuleOutput(next_state, z, loss, metrics, None)
