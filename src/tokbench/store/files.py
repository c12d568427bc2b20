"""Reading tokbench JSON result files, the store's import format; errors name the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

from tokbench.errors import StoreError
from tokbench.records import SCHEMA_VERSION, RunResult, run_from_dict


def read_result_file(path: Path) -> RunResult:
    """The run in a result file written by `report.export.write_result_json` (figures in it are ignored)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StoreError(f"{path}: no such result file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise StoreError(f"{path}: cannot read ({e})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise StoreError(
            f"{path}: not JSON (line {e.lineno} column {e.colno}: {e.msg}); is this a tokbench result file?"
        ) from None
    if not isinstance(d, dict):
        raise StoreError(f"{path}: expected a JSON object with 'schema_version', 'meta' and 'levels'")
    version = d.get("schema_version")
    if version is None:
        raise StoreError(f"{path}: missing key 'schema_version'; is this a tokbench result file?")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StoreError(f"{path}: schema_version: expected an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path}: schema_version {version} is newer than this tokbench reads ({SCHEMA_VERSION}); "
            "upgrade tokbench to read it"
        )
    for key in ("meta", "levels"):
        if key not in d:
            raise StoreError(f"{path}: missing key '{key}'; not a tokbench result file, or it was cut short")
    if not isinstance(d["meta"], dict):
        raise StoreError(f"{path}: meta: expected an object")
    if not isinstance(d["levels"], list) or not all(isinstance(lv, dict) for lv in d["levels"]):
        raise StoreError(f"{path}: levels: expected a list of objects")
    try:
        return run_from_dict(d, where=str(path))
    except StoreError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise StoreError(f"{path}: malformed result ({type(e).__name__}: {e})") from None
