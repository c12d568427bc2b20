"""Crash triage: the root-cause line each kind of engine failure leaves in its log, and the exit status."""

from __future__ import annotations

import pytest

from tokbench.server.diagnose import RULES, TAIL_LINES, describe_exit, format_triage, triage

SGLANG_ASSERT = """\
[2026-05-01 10:00:01] server_args=ServerArgs(model_path='/m/Qwen3.5', ...)
Traceback (most recent call last):
  File "/usr/lib/python3.12/runpy.py", line 198, in _run_module_as_main
    return _run_code(code, main_globals, None,
  File "/sgl/python/sglang/launch_server.py", line 11, in <module>
    server_args = prepare_server_args(sys.argv[1:])
  File "/sgl/python/sglang/srt/server_args.py", line 2315, in _handle_speculative_decoding
    assert (
        self.speculative_eagle_topk is None
        and self.speculative_num_draft_tokens is None
    )
AssertionError
"""

VALUE_ERROR = """\
INFO loading
Traceback (most recent call last):
  File "/sgl/python/sglang/srt/server_args.py", line 900, in __post_init__
    raise ValueError(
ValueError: Spec v2 currently only supports topk = 1 for speculative decoding.
[rank0]: some shutdown noise
"""


def test_bare_assertion_is_named_with_its_source_and_place() -> None:
    t = triage(SGLANG_ASSERT, 1)
    assert t.root_cause is not None
    assert t.root_cause.startswith("AssertionError")
    assert "self.speculative_eagle_topk is None" in t.root_cause
    assert "server_args.py:2315" in t.root_cause
    assert t.label == "Python exception"


def test_assertion_without_source_still_names_where() -> None:
    log = 'Traceback (most recent call last):\n  File "<string>", line 3, in f\nAssertionError\n'
    assert triage(log, 1).root_cause == "AssertionError (assert failed at <string>:3)"


def test_last_python_exception_wins_over_later_noise() -> None:
    t = triage(VALUE_ERROR, 1)
    assert t.root_cause == "ValueError: Spec v2 currently only supports topk = 1 for speculative decoding."


VLLM_PREFIXED = """\
(APIServer pid=4242) INFO 12-03 07:00:00 [api_server.py:1896] vLLM API server version 0.11.0
(APIServer pid=4242) Traceback (most recent call last):
(APIServer pid=4242)   File "/vllm/vllm/engine/arg_utils.py", line 1117, in create_speculative_config
(APIServer pid=4242)     raise ValueError(
(APIServer pid=4242) ValueError: num_speculative_tokens was provided but without speculative model.
[rank0]:[W1203 07:00:01] ProcessGroupNCCL.cpp:1479] destroy_process_group() was not called
"""


def test_process_prefixes_of_multi_process_engines_do_not_hide_the_exception() -> None:
    t = triage(VLLM_PREFIXED, 1)
    assert t.root_cause == "ValueError: num_speculative_tokens was provided but without speculative model."
    assert t.label == "Python exception"
    worker = (
        "(EngineCore_DP0 pid=77) Traceback (most recent call last):\n(EngineCore_DP0 pid=77) AssertionError\n"
    )
    assert triage(worker, 1).root_cause == "AssertionError (no message)"
    assert t.tail[-1].startswith("[rank0]:")  # the tail stays as the engine wrote it


@pytest.mark.parametrize(
    ("line", "label"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "CUDA out of memory"),
        ("RuntimeError: CUDA error: out of memory", "CUDA out of memory"),
        ("OSError: [Errno 98] Address already in use", "address in use"),
        ("srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", "address in use"),
        ("error: invalid argument: --spec-typo", "unknown argument"),
        (
            'error while handling argument "--spec-type": unknown speculative decoding type',
            "unknown argument",
        ),
        ("llama_model_load: error loading model: tensor 'blk.0' not found", "model load failed"),
        ("launch_server.py: error: unrecognized arguments: --speculative-algo-x NEXTN", "unknown argument"),
        ("/ggml/src/ggml.c:1234: GGML_ASSERT(ctx->mem_buffer != NULL) failed", "GGML_ASSERT"),
        ("terminate called after throwing an instance of 'std::runtime_error'", "C++ terminate"),
        ("llama_model_load: error: failed to open /m/missing.gguf", "error"),
        ("KeyError: 'qwen3_5_moe'", "Python exception"),
        ("Segmentation fault (core dumped)", "fatal signal"),
    ],
)
def test_each_kind_of_root_cause(line: str, label: str) -> None:
    log = f"starting\nloading weights\n{line}\nshutting down worker 3\n"
    t = triage(log, 1)
    assert t.root_cause == line.strip()
    assert t.label == label


def test_usage_text_after_the_error_does_not_hide_it() -> None:
    log = (
        "build: 6000 (abc)\n"
        'error while handling argument "--flash-attn": expected value for argument\n'
        "\nusage:\n"
        "-fa,   --flash-attn [on|off|auto]  set Flash Attention use\n"
        "--log-file FNAME                   log to file; error: goes to stderr too\n"
    )
    t = triage(log, 1)
    assert t.root_cause == 'error while handling argument "--flash-attn": expected value for argument'


def test_no_matching_line_leaves_root_cause_empty_and_tail_explains() -> None:
    log = "\n".join(f"INFO step {i}" for i in range(100))
    t = triage(log, -9)
    assert t.root_cause is None and t.label is None
    assert len(t.tail) == TAIL_LINES
    assert t.tail[-1] == "INFO step 99" and t.tail[0] == f"INFO step {100 - TAIL_LINES}"
    text = format_triage(t, config="nextn", what="died", log_path="logs/nextn-2.log")
    assert "no known error line" in text and "killed by SIGKILL (-9)" in text and "logs/nextn-2.log" in text
    assert text.count("\n    | ") == TAIL_LINES


def test_exit_descriptions() -> None:
    assert describe_exit(-15) == "killed by SIGTERM (-15)"
    assert describe_exit(1) == "exit code 1"
    assert "SIGKILL" in describe_exit(137)
    assert describe_exit(None) == "still running"


def test_rules_are_data() -> None:
    labels = [label for _, label in RULES]
    assert "CUDA out of memory" in labels and "unknown argument" in labels
    # a line matching several rules gets the most specific label (the OOM one comes before the exception)
    assert triage("torch.OutOfMemoryError: CUDA out of memory.", 1).label == "CUDA out of memory"
