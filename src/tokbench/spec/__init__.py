"""Speculative decoding accounting: run-scoped acceptance (scrape), the speedup model and its fit (model),
why speculation did not pay (diagnose), and whether it changed the outputs (lossless)."""

from tokbench.spec.diagnose import (
    ConfigChange,
    Finding,
    LevelDiagnosis,
    LevelInput,
    diagnose,
    diagnose_levels,
)
from tokbench.spec.lossless import Divergence, LosslessResult, lossless_check
from tokbench.spec.model import Fit, Prediction, alpha_positions, fit, predict, predicted_speedup
from tokbench.spec.scrape import Acceptance, acceptance_to_dict, level_acceptance, trial_acceptance

__all__ = [
    "Acceptance",
    "ConfigChange",
    "Divergence",
    "Finding",
    "Fit",
    "LevelDiagnosis",
    "LevelInput",
    "LosslessResult",
    "Prediction",
    "acceptance_to_dict",
    "alpha_positions",
    "diagnose",
    "diagnose_levels",
    "fit",
    "level_acceptance",
    "lossless_check",
    "predict",
    "predicted_speedup",
    "trial_acceptance",
]
