"""Workload: which prompts a sweep sends (built-in corpus, JSONL or ShareGPT file), seeded."""

from tokbench.workload.prompts import Prompt, PromptSource, builtin_corpus, load_prompts, read_prompt_file

__all__ = ["Prompt", "PromptSource", "builtin_corpus", "load_prompts", "read_prompt_file"]
