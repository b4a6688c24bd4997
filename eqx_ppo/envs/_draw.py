"""A tiny numpy rasteriser for the `render` methods of the built-in envs."""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._typecheck import check_range
from ._state import State


def frames(
    trajectory: Sequence[Any],
    height: int,
    width: int,
    extent: float,
    draw: Callable[["Canvas", Any], None],
) -> list[np.ndarray]:
    """One `[height, width, 3]` `uint8` image per state (or pipeline state):
    `draw(canvas, pipeline_state)` on a fresh canvas of half-width `extent`."""
    images = []
    for state in trajectory:
        canvas = Canvas(height, width, extent)
        draw(canvas, state.pipeline_state if isinstance(state, State) else state)
        images.append(canvas.image)
    return images


class Canvas:
    """A white RGB image whose pixels know their world coordinates: the square
    `[-extent, extent]^2` fits the shorter side, `y` pointing up."""

    def __init__(self, height: int, width: int, extent: float):
        check_range("render(height=", height, 1)
        check_range("render(width=", width, 1)
        scale = 2 * extent / min(height, width)
        cols = (np.arange(width) - width / 2 + 0.5) * scale
        rows = (height / 2 - np.arange(height) - 0.5) * scale
        self.x, self.y = np.meshgrid(cols, rows)
        self.image = np.full((height, width, 3), 255, np.uint8)

    def disk(self, center: np.ndarray, radius: float, color: tuple) -> None:
        inside = (self.x - center[0]) ** 2 + (self.y - center[1]) ** 2 <= radius**2
        self.image[inside] = color

    def segment(
        self, start: np.ndarray, end: np.ndarray, width: float, color: tuple
    ) -> None:
        direction = end - start
        length_sq = max(float(direction @ direction), 1e-12)
        t = (self.x - start[0]) * direction[0] + (self.y - start[1]) * direction[1]
        t = np.clip(t / length_sq, 0.0, 1.0)
        dx = self.x - (start[0] + t * direction[0])
        dy = self.y - (start[1] + t * direction[1])
        self.image[dx**2 + dy**2 <= (width / 2) ** 2] = color
