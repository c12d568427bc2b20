"""The exception tree. Request failures are data (RequestRecord.error_kind); these are for infrastructure.

TokbenchError
├── ConfigError            bad flag, plan field or input file; names the field and the fix
│   └── PreflightError     a server configuration that would crash at launch (a known flag conflict)
├── ServerError            an engine we launched or probe
│   ├── ServerStartError   died or never became ready; carries the triage
│   └── ServerCrashError   died while being measured
├── EngineInstallError     building llama-server or assembling the model failed
├── StoreError             the results store or a result file cannot be read or written
└── InsufficientDataError  a figure needs more data than was recorded
"""

from __future__ import annotations


class TokbenchError(Exception):
    """Base of every error tokbench raises on purpose; the CLI turns these into a message and an exit code."""

    exit_code = 1


class ConfigError(TokbenchError):
    exit_code = 2


class PreflightError(ConfigError):
    pass


class ServerError(TokbenchError):
    exit_code = 3


class ServerStartError(ServerError):
    pass


class ServerCrashError(ServerError):
    pass


class EngineInstallError(TokbenchError):
    exit_code = 4


class StoreError(TokbenchError):
    exit_code = 5


class InsufficientDataError(TokbenchError):
    exit_code = 6
