"""Set-up step: build llama.cpp's `llama-server` from the sources llama-cpp-python vendors.

The shared reasoner (llama_server.py) runs `llama-server` as a child process. No PyPI wheel ships it
under a usable licence, but llama-cpp-python's sdist carries the llama.cpp tree it binds, server
sources included, so the binary is the same llama.cpp version as the in-process backend. `make setup`
runs this module; it is idempotent: a binary whose stamp names the same version and flags is kept.

    python -m models.background.llama_server_build [--jobs 2] [--force]

Steps (each prints a line): 1. `pip download` the sdist of the installed llama-cpp-python version
(from pip's cache when `pip install` fetched it already); 2. extract `vendor/llama.cpp`; 3. configure
a portable static build (no -march=native: its AMX kernels crash on this project's machines; no web
UI and no download of one; no curl, no OpenSSL); 4. build the `llama-server` target (~5.5 min on 2
cores); 5. install it as `<venv>/bin/llama-server` with a stamp beside it, and keep a copy in
`~/.cache/duplex/llama-server/` keyed by version and flags (the next venv on this machine copies it
instead of compiling; `--no-cache` to skip); 6. check that it runs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PACKAGE = "llama-cpp-python"
BINARY = "llama-server"

# Portable: AVX2-class x86 without the CPU-specific kernels a native build picks (AMX crashed here).
X86_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON"]
COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary: nothing to find at run time
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",  # it never downloads anything
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # the web UI is npm or a Hugging Face download
]


def default_binary() -> Path:
    """Where set-up installs it: beside the venv's python."""
    return Path(sys.prefix) / "bin" / BINARY


def cmake_flags() -> list[str]:
    arch = X86_FLAGS if platform.machine() in ("x86_64", "AMD64") else ["-DGGML_NATIVE=OFF"]
    return COMMON_FLAGS + arch


def _stamp(version: str) -> str:
    return f"{PACKAGE}=={version} {' '.join(cmake_flags())}\n"


def _stamp_path(binary: Path) -> Path:
    return binary.with_name(binary.name + ".stamp")


def installed_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"error: {PACKAGE} is not installed; `make setup` installs it first") from None


def up_to_date(binary: Path, version: str) -> bool:
    stamp = _stamp_path(binary)
    return binary.is_file() and stamp.is_file() and stamp.read_text() == _stamp(version)


def cache_dir() -> Path:
    """Built binaries kept per version and flags, as pip keeps built wheels: a second venv or a fresh
    clone on the same machine copies the binary instead of compiling for minutes."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "duplex" / "llama-server"


def _cached(version: str) -> Path:
    key = hashlib.sha256(_stamp(version).encode()).hexdigest()[:16]
    return cache_dir() / f"{version}-{key}" / BINARY


def _install(built: Path, binary: Path, version: str) -> None:
    """Copy `built` to `binary` atomically and write its stamp."""
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(binary.name + ".tmp")
    shutil.copy2(built, tmp)
    os.replace(tmp, binary)
    _stamp_path(binary).write_text(_stamp(version))


def _step(n: int, text: str) -> None:
    print(f">> llama-server build {n}/6: {text}", flush=True)


def _run(cmd: list[str], **kw: object) -> None:
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def build(version: str, binary: Path, jobs: int, work: Path) -> None:
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    _step(1, f"fetching the {PACKAGE} {version} sdist (llama.cpp sources)")
    sdists = list(work.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not sdists:
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              f"{PACKAGE}=={version}", "-d", str(work)])
        sdists = list(work.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not sdists:
        raise SystemExit(f"error: pip downloaded no llama_cpp_python-{version}.tar.gz into {work}")
    _step(2, "extracting vendor/llama.cpp")
    src = work / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
    _step(3, "configuring (portable flags: " + " ".join(cmake_flags()) + ")")
    out = work / "build"
    _run(["cmake", "-S", str(src), "-B", str(out), *cmake_flags()], stdout=subprocess.DEVNULL)
    _step(4, f"compiling with {jobs} jobs (about 5-6 min on 2 cores; a line per object)")
    _run(["cmake", "--build", str(out), "--target", BINARY, "-j", str(jobs)])
    _step(5, f"installing {binary}")
    built = out / "bin" / BINARY
    _install(built, binary, version)
    try:  # a cache that cannot be written only costs the next set-up a build
        cached = _cached(version)
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, cached.with_name(BINARY + ".tmp"))
        os.replace(cached.with_name(BINARY + ".tmp"), cached)
    except OSError as exc:
        print(f">> could not keep the binary in {cache_dir()}: {exc}", flush=True)
    print(f">> llama-server built in {time.monotonic() - t0:.0f} s", flush=True)


def check(binary: Path) -> None:
    """The binary starts and reports its version (a crash on this CPU shows here, at set-up)."""
    _step(6, "checking that it runs")
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise SystemExit(f"error: {binary} --version failed (exit {proc.returncode}):\n{text[-2000:]}")
    line = next((ln for ln in text.splitlines() if ln.startswith("version")), text.splitlines()[0] if text else "")
    print(f">> {binary.name} ok: {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=default_binary(), help="where to install (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compile jobs (default: the cores)")
    ap.add_argument("--work", type=Path, default=None,
                    help="build directory, kept for a faster rebuild (default: a temporary one)")
    ap.add_argument("--force", action="store_true", help="build even when the stamp says it is up to date")
    ap.add_argument("--no-cache", action="store_true",
                    help=f"neither reuse nor keep a built binary in {cache_dir()} (per version and flags)")
    args = ap.parse_args(argv)
    version = installed_version()
    if not args.force and up_to_date(args.binary, version):
        print(f">> {args.binary} is up to date ({PACKAGE} {version})", flush=True)
        return 0
    cached = _cached(version)
    if not args.force and not args.no_cache and cached.is_file():
        print(f">> llama-server: reusing the binary built before for these sources and flags ({cached})", flush=True)
        _install(cached, args.binary, version)
        check(args.binary)
        return 0
    if shutil.which("cmake") is None:
        raise SystemExit("error: building llama-server needs cmake and a C++ compiler (apt-get install cmake g++)")
    if args.work is not None:
        build(version, args.binary, args.jobs, args.work)
    else:
        with tempfile.TemporaryDirectory(prefix="llama-server-build-") as tmp:
            build(version, args.binary, args.jobs, Path(tmp))
    check(args.binary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
