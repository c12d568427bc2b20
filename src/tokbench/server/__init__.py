"""Engines: launch, readiness, crash triage, preflight rules, per-engine facts, and the llama.cpp install."""
