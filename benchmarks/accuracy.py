"""How closely the backend computes float32 `exp`, `log`, `tanh`, ... : the
tolerance a test against exact values needs there.

    python -m benchmarks.accuracy

Each function, compiled on the default backend, on about 240,000 float32
points (a uniform grid over [-20, 20] and geometric ones down to 1e-6 on each
side; `log` and `log1p` on their absolute values plus 1e-6) against float64
NumPy: the largest and the median error in float32 ulps of the exact value,
and the largest relative error. `tests/_helpers.py`'s `TPU_RTOL` comes from
the TPU's table. Written to `results/<backend>_accuracy.{json,md}`.
"""

import argparse
from typing import Any

import numpy as np

from ._common import hardware, machine, publish


def _functions() -> dict[str, tuple[Any, Any, bool]]:
    """name: (JAX function, float64 NumPy reference, positive inputs only)."""
    import jax
    import jax.numpy as jnp

    return {
        "exp": (jnp.exp, np.exp, False),
        "expm1": (jnp.expm1, np.expm1, False),
        "log": (jnp.log, np.log, True),
        "log1p": (jnp.log1p, np.log1p, True),
        "tanh": (jnp.tanh, np.tanh, False),
        "sigmoid": (jax.nn.sigmoid, lambda v: 1 / (1 + np.exp(-v)), False),
        "softplus": (jax.nn.softplus, lambda v: np.logaddexp(0, v), False),
    }


def run() -> dict[str, Any]:
    import jax

    tail = np.geomspace(1e-6, 20, 20001)
    x = np.concatenate([np.linspace(-20, 20, 200001), tail, -tail]).astype(np.float32)
    rows = {}
    for name, (fn, reference, positive) in _functions().items():
        points = np.abs(x) + np.float32(1e-6) if positive else x
        got = np.asarray(jax.jit(fn)(points), np.float64)
        want = reference(points.astype(np.float64))
        error = np.abs(got - want)
        ulps = error / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        worst = int(np.argmax(ulps))
        rows[name] = {
            "max_ulp": float(ulps.max()),
            "at": float(points[worst]),
            "median_ulp": float(np.median(ulps)),
            "max_rel": float((error / np.maximum(np.abs(want), 1e-30)).max()),
        }
    return {"backend": jax.default_backend(), "functions": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"### float32 elementwise accuracy on {result['backend']}",
        "",
        f"Against float64 NumPy; JAX {result['versions'].get('jax')} on "
        f"{hardware(result['machine'])}.",
        "",
        "| function | max error (ulp) | at x | median (ulp) | max relative error |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["functions"].items():
        lines.append(
            f"| `{name}` | {row['max_ulp']:.1f} | {row['at']:.4g} | "
            f"{row['median_ulp']:.2f} | {row['max_rel']:.2e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="accuracy", help="results file stem")
    args = parser.parse_args(argv)
    started = machine()
    publish(args.name, run(), markdown, started)


if __name__ == "__main__":
    main()
