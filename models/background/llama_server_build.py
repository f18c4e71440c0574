"""Set-up step: the one build of llama.cpp, for `llama-server` and for the in-process bindings.

The shared reasoner (llama_server.py) runs `llama-server` as a child process; the text end-of-turn model
(models/speech/text_turn.py) and the in-process reasoner (llamacpp_backend.py) call llama.cpp through
llama-cpp-python. No PyPI wheel ships either build, but llama-cpp-python's sdist carries the llama.cpp
tree it binds, server sources included. So the sdist of one pinned version is compiled once, as shared
libraries plus the server, and llama-cpp-python is installed without compiling anything (its
`LLAMA_BUILD=OFF`), its `llama_cpp/lib/` pointing at those same libraries. `make setup` runs this module;
it is idempotent: a build whose stamp names the same version and flags is kept.

    python -m models.background.llama_server_build [--jobs 2] [--force]

Steps (each prints a line): 1. `pip download` the sdist of llama-cpp-python `VERSION` to a temporary
directory; 2. extract `vendor/llama.cpp`; 3. configure a portable shared-library build (no
-march=native: its AMX kernels crash on this project's machines; no web UI and no download of one; no
curl, no OpenSSL); 4. build the `llama-server` target, which builds libllama and libggml too; 5. install
the server and the libraries in `<venv>/lib/llama.cpp/` (`<venv>/bin/llama-server` links to it) and keep
a copy in `~/.cache/duplex/llama-server/` keyed by version and flags (the next venv on this machine copies
it instead of compiling; `--no-cache` to skip); 6. install the Python bindings from the same sdist, their
libraries linked to the build; 7. check that the server starts and that the bindings generate a token.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

PACKAGE = "llama-cpp-python"
# The one place the llama.cpp version is chosen: the server and the bindings are built from this sdist.
VERSION = "0.3.36"
BINARY = "llama-server"
STEPS = 7
_PERCENT = re.compile(r"\[\s*(\d+)%\]")  # cmake's "[ 42%] Building CXX object ..."

# Portable: AVX2-class x86 without the CPU-specific kernels a native build picks (AMX crashed here).
X86_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON"]
COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    # Shared libraries, so that the bindings load the very code the server runs; each file finds the
    # others in its own directory, wherever the directory is copied to.
    "-DBUILD_SHARED_LIBS=ON", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",  # it never downloads anything
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",  # the web UI is npm or a Hugging Face download
]


def default_binary() -> Path:
    """Where `llama_server.find_binary` looks first: beside the venv's python."""
    return Path(sys.prefix) / "bin" / BINARY


def build_dir() -> Path:
    """The installed build: the server and the shared libraries it and the bindings load."""
    return Path(sys.prefix) / "lib" / "llama.cpp"


def cmake_flags() -> list[str]:
    arch = X86_FLAGS if platform.machine() in ("x86_64", "AMD64") else ["-DGGML_NATIVE=OFF"]
    return COMMON_FLAGS + arch


def _stamp() -> str:
    return f"{PACKAGE}=={VERSION} {' '.join(cmake_flags())}\n"


def _bindings_lib() -> Path:
    """Where llama-cpp-python loads its libraries from (llama_cpp/lib in this venv's site-packages)."""
    return Path(sysconfig.get_paths()["platlib"]) / "llama_cpp" / "lib"


def _bindings_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def up_to_date(binary: Path, where: Path) -> bool:
    """The build, the link to it and the bindings are all there, of this version and these flags."""
    linked = (_bindings_lib() / "libllama.so").resolve().parent == where.resolve()
    return _built(binary, where) and linked and _bindings_version() == VERSION


def _built(binary: Path, where: Path) -> bool:
    """The server and the libraries of this version and these flags are installed (the bindings may not be)."""
    stamp = where / "stamp"
    return binary.is_file() and stamp.is_file() and stamp.read_text() == _stamp()


def cache_dir() -> Path:
    """Built binaries kept per version and flags, as pip keeps built wheels: a second venv or a fresh
    clone on the same machine copies the build instead of compiling for minutes."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "duplex" / "llama-server"


def _cached() -> Path:
    key = hashlib.sha256(_stamp().encode()).hexdigest()[:16]
    return cache_dir() / f"{VERSION}-{key}"


def _products(out: Path) -> list[Path]:
    """The server and the shared libraries (with their version links) in a build's output folder."""
    return sorted(p for p in out.iterdir() if p.name == BINARY or (p.name.startswith("lib") and ".so" in p.name))


def _copy_tree(products: list[Path], dest: Path) -> None:
    """Copy `products` into `dest` (replaced whole, through a temporary sibling), links kept as links."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for p in products:
        shutil.copy2(p, tmp / p.name, follow_symlinks=False)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def _link(target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _install(products: list[Path], binary: Path, where: Path) -> None:
    """Install the build in `where`, link `binary` to its server and write the stamp last."""
    _copy_tree(products, where)
    _link(where / BINARY, binary)
    (where / "stamp").write_text(_stamp())


def _step(n: int, text: str) -> None:
    print(f">> llama.cpp build {n}/{STEPS}: {text}", flush=True)


def _run(cmd: list[str], **kw: object) -> None:
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def fetch_sdist(work: Path) -> Path:
    _step(1, f"fetching the {PACKAGE} {VERSION} sdist (llama.cpp sources)")
    name = f"llama_cpp_python-{VERSION}.tar.gz"
    if not (work / name).is_file():
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              f"{PACKAGE}=={VERSION}", "-d", str(work)])
    if not (work / name).is_file():
        raise SystemExit(f"error: pip downloaded no {name} into {work}")
    return work / name


def compile_build(sdist: Path, jobs: int, work: Path) -> list[Path]:
    """Steps 2-4: the server and the libraries, built in `work`."""
    t0 = time.monotonic()
    _step(2, "extracting vendor/llama.cpp")
    src = work / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
    _step(3, "configuring (portable flags: " + " ".join(cmake_flags()) + ")")
    out = work / "build"
    _run(["cmake", "-S", str(src), "-B", str(out), *cmake_flags()], stdout=subprocess.DEVNULL)
    _step(4, f"compiling with {jobs} jobs (about 5-6 min on 2 cores; a line per tenth; the log if it fails)")
    _compile(["cmake", "--build", str(out), "--target", BINARY, "-j", str(jobs)], out / "build.log", t0)
    print(f">> llama.cpp compiled in {time.monotonic() - t0:.0f} s", flush=True)
    return _products(out / "bin")


def _compile(cmd: list[str], log_path: Path, t0: float) -> None:
    """Run the compile with its output in `log_path` and a progress line per tenth of it: the set-up runs
    it beside pip and apt (Makefile), whose lines a line per object would bury."""
    shown = -1
    with open(log_path, "w") as log_file, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                           text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            m = _PERCENT.match(line)
            if m and int(m.group(1)) // 10 > shown:
                shown = int(m.group(1)) // 10
                print(f">> llama.cpp build 4/{STEPS}: {shown * 10:3d} % after {time.monotonic() - t0:.0f} s",
                      flush=True)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(f"error: compiling llama.cpp failed (exit {proc.returncode}); the end of "
                         f"{log_path}:\n" + "\n".join(tail))


def keep_in_cache(products: list[Path]) -> None:
    try:  # a cache that cannot be written only costs the next set-up a build
        _copy_tree(products, _cached())
    except OSError as exc:
        print(f">> could not keep the build in {cache_dir()}: {exc}", flush=True)


def install_bindings(sdist: Path, where: Path) -> None:
    """Step 6: llama-cpp-python's Python files from the same sdist, compiling nothing, its libraries
    linked to the build (pip's wheel cache is skipped: that wheel has no libraries of its own)."""
    _step(6, f"installing the {PACKAGE} {VERSION} bindings (nothing compiled) on {where}")
    if _bindings_version() != VERSION:
        env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"}
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", str(sdist)], env=env)
    lib = _bindings_lib()
    lib.mkdir(parents=True, exist_ok=True)
    for p in where.iterdir():
        if p.name.startswith("lib"):
            _link(p, lib / p.name)


def check(binary: Path) -> None:
    """The server starts and the bindings generate a token (a build that crashes on this CPU shows here,
    at set-up, not in the middle of a conversation); the generation runs in a child, where a crash is a
    signal to report."""
    _step(7, "checking that llama-server starts and the bindings generate")
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise SystemExit(f"error: {binary} --version failed (exit {proc.returncode}):\n{text[-2000:]}")
    line = next((ln for ln in text.splitlines() if ln.startswith("version")), text.splitlines()[0] if text else "")
    print(f">> {binary.name} ok: {line}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "models.background.llama_server_build", "--generate"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode < 0:
        raise SystemExit(f"error: the llama.cpp bindings crashed with {signal.Signals(-proc.returncode).name}")
    if proc.returncode != 0:
        raise SystemExit(f"error: the llama.cpp bindings failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    print(f">> {proc.stdout.strip()}", flush=True)


def generate(tokens: int = 2) -> None:
    """Child of `check`: load the bundled GGUF through the bindings and generate `tokens` tokens."""
    from llama_cpp import Llama

    from models.background.llamacpp_backend import bundled_gguf

    # One thread for the prompt too (llama-cpp-python's `n_threads_batch` defaults to every core): the set-up
    # runs this beside pip and the compile, where batch threads spin-waiting for each other made a 2-token
    # check cost ~2.5 s of CPU instead of ~0.5 s.
    llm = Llama(model_path=str(bundled_gguf()), n_ctx=256, n_threads=1, n_threads_batch=1, seed=0, verbose=False)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Say hello."}], max_tokens=tokens)
    text = out["choices"][0]["message"]["content"] or ""  # type: ignore[index]
    print(f"bindings ok: {text.strip()!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=default_binary(), help="link to the server (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compile jobs (default: the cores)")
    ap.add_argument("--work", type=Path, default=None,
                    help="build directory, kept for a faster rebuild (default: a temporary one)")
    ap.add_argument("--force", action="store_true", help="build even when the stamp says it is up to date")
    ap.add_argument("--no-cache", action="store_true",
                    help=f"neither reuse nor keep a build in {cache_dir()} (per version and flags)")
    ap.add_argument("--build-only", action="store_true",
                    help="steps 1-5 only (fetch, compile, install the server): needs no package of the venv, so "
                         "the set-up runs it beside pip (Makefile); a later run without it adds the bindings")
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generate:
        generate()
        return 0
    where = build_dir()
    if not args.force and up_to_date(args.binary, where):
        print(f">> llama.cpp is up to date ({PACKAGE} {VERSION}, {where})", flush=True)
        return 0
    if args.build_only and not args.force and _built(args.binary, where):
        print(f">> llama.cpp is built ({PACKAGE} {VERSION}, {where}); the bindings come later", flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="llama-cpp-build-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        sdist = fetch_sdist(work)
        cached = _cached()
        if not args.force and _built(args.binary, where):
            _step(5, f"the server and libraries are installed already ({where}; --build-only made them)")
        elif not args.force and not args.no_cache and (cached / BINARY).is_file():
            _step(5, f"reusing the build made before for these sources and flags ({cached})")
            _install(_products(cached), args.binary, where)
        else:
            if shutil.which("cmake") is None:
                raise SystemExit("error: building llama.cpp needs cmake and a C++ compiler (apt-get install cmake g++)")
            products = compile_build(sdist, args.jobs, work)
            _step(5, f"installing the server and libraries in {where}")
            _install(products, args.binary, where)
            if not args.no_cache:
                keep_in_cache(products)
        if args.build_only:
            print(f">> llama.cpp built ({where}); steps 6-7 (bindings, check) run without --build-only", flush=True)
            return 0
        install_bindings(sdist, where)
    check(args.binary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
