"""Robust scaling shared by the learned metric detectors.

Features live on wildly different scales (watts, MiB fractions, seconds, tokens/s). Each learned model
is trained on rows scaled by the training median and MAD, and NaN (a feature a scrape did not carry)
becomes 0, i.e. the median: an absent feature never looks anomalous by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float64]

# 1.4826 * MAD estimates the standard deviation of a normal distribution
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class RobustScaler:
    """Per-feature median and scale learned from training rows."""

    median: tuple[float, ...]
    scale: tuple[float, ...]

    @classmethod
    def fit(cls, rows: Matrix) -> RobustScaler:
        """Learn medians and robust scales, ignoring NaN.

        The scale is the larger of the MAD (as a standard deviation) and the 1st-99th percentile range
        over 4.65 (the width of that range for a normal distribution): a feature that is usually zero,
        like waiting requests, has a MAD of 0 but a real spread in its tail. A feature that never moved
        gets a floor: a share of its level, or 1e-3.
        """
        median = np.nanmedian(rows, axis=0)
        mad = np.nanmedian(np.abs(rows - median), axis=0) * MAD_TO_SIGMA
        low, high = np.nanpercentile(rows, [1, 99], axis=0)
        tail = (high - low) / 4.65
        floor = np.maximum(np.abs(median) * 0.05, 1e-3)
        spread = np.fmax(np.nan_to_num(mad, nan=0.0), np.nan_to_num(tail, nan=0.0))
        scale = np.where(spread > floor, spread, floor)
        median = np.where(np.isfinite(median), median, 0.0)
        return cls(tuple(float(v) for v in median), tuple(float(v) for v in scale))

    def transform(self, rows: Matrix) -> Matrix:
        """Scale rows; NaN becomes 0 (the median)."""
        scaled = (np.asarray(rows, dtype=np.float64) - np.asarray(self.median)) / np.asarray(self.scale)
        return np.nan_to_num(scaled, nan=0.0, posinf=1e6, neginf=-1e6)

    def top_deviations(self, row: Matrix, names: tuple[str, ...], k: int = 3) -> dict[str, float]:
        """The ``k`` features furthest from the training median, in robust z units (for evidence)."""
        z = self.transform(row.reshape(1, -1))[0]
        order = np.argsort(-np.abs(z))[:k]
        return {names[i]: round(float(z[i]), 2) for i in order if abs(z[i]) > 0}
