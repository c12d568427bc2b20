"""Statistics: per-trial figures from raw records, intervals over trials, A/B verdicts, power, calibration."""
