"""Set-up check: the embedded reasoner (llama-cpp-python + the bundled GGUF) generates a few tokens.

`make setup` runs `python -m models.background.llamacpp_check` right after installing, so a llama.cpp
build that crashes on this CPU (seen: the AMX kernels of a -march=native build, SIGSEGV in
ggml_backend_amx_mul_mat) fails the set-up with a clear message instead of killing the server in the
middle of a conversation. The generation runs in a child process: a crash there is a signal we can
report, not the end of this process.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

REBUILD_HINT = (
    "rebuild llama-cpp-python as a portable binary:\n"
    '  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    ".venv/bin/python -m pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python\n"
    "or run the server with another --background backend."
)


def _generate(tokens: int) -> None:
    """Child process: load the bundled GGUF and stream `tokens` tokens of a chat answer."""
    from llama_cpp import Llama

    from models.background.llamacpp_backend import bundled_gguf

    llm = Llama(model_path=str(bundled_gguf()), n_ctx=256, n_threads=1, seed=0, verbose=False)
    out = llm.create_chat_completion(messages=[{"role": "user", "content": "Say hello."}], max_tokens=tokens)
    text = out["choices"][0]["message"]["content"] or ""  # type: ignore[index]
    print(f"embedded reasoner ok: {text.strip()!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4, help="tokens to generate (default 4)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _generate(args.tokens)
        return 0
    cmd = [sys.executable, "-m", "models.background.llamacpp_check", "--child", "--tokens", str(args.tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        sys.stdout.write(proc.stdout)
        return 0
    if proc.returncode < 0:
        what = f"crashed with {signal.Signals(-proc.returncode).name}"
    else:
        what = f"failed (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}"
    print(f"error: the embedded reasoner (llama-cpp-python) {what}\n{REBUILD_HINT}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
