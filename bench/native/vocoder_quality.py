"""python -m bench.native.vocoder_quality: what the native model's streaming vocoder costs and how well it inverts.

    python -m bench.native.vocoder_quality --sessions 16 --iters 8 --json

A speech-like test signal (a glottal pulse train with gliding pitch through moving formants, syllable
envelopes, a few noise bursts) is analysed into the normalised log-mel the flow head produces, then
streamed through the vocoder micro-turn by micro-turn, exactly as the runtime calls it. Reported:

* `ms_per_call`: one call for `--sessions` rows (median), the per-micro-turn cost at that batch;
* `spectral_convergence`: || |STFT(out)| - |STFT(in)| ||_F / || |STFT(in)| ||_F over the whole stream,
  at the best alignment (lower is better; the mel inversion bounds it from below);
* `mel_sc`: the same on 80-bin mel magnitudes (what the model controls), and `mel_db`: the mean
  absolute log-mel difference in dB.

It only uses the vocoder's public interface (initial_state, __call__), so the same command measures
older versions of it for before/after comparisons.
"""

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from models.interaction import vocoder as voc
from models.interaction.config import FRAMES_PER_TICK
from models.interaction.dmel import mel_filterbank


@dataclass
class VocoderReport:
    iters: int
    sessions: int
    seconds: float
    ms_per_call: float
    cpu_ms_per_call: float  # process CPU time: less sensitive to other processes on a shared machine
    spectral_convergence: float
    mel_sc: float
    mel_db: float
    torch_threads: int


def speech_like(seconds: float, seed: int = 0) -> torch.Tensor:
    """[N] float32 at 24 kHz, peak about 0.5: voiced syllables with gliding pitch and formants, some noise."""
    g = torch.Generator().manual_seed(seed)
    n = int(seconds * voc.RATE)
    t = torch.arange(n, dtype=torch.float64) / voc.RATE
    f0 = 140 + 60 * torch.sin(2 * torch.pi * 0.7 * t)  # Hz
    phase = torch.cumsum(2 * torch.pi * f0 / voc.RATE, 0)
    src = torch.zeros(n, dtype=torch.float64)
    for h in range(1, 40):  # harmonics up to ~8 kHz with a -12 dB/octave glottal tilt
        src += torch.sin(h * phase) / h**2 * (h * f0 < 9000)
    spec = torch.fft.rfft(src)
    freqs = torch.fft.rfftfreq(n, 1 / voc.RATE)
    shaped = torch.zeros_like(spec)
    for f1, f2 in ((700, 1200), (400, 2000), (300, 2300)):  # three vowels' formants, one third each
        env = sum(1 / (1 + ((freqs - f) / 90) ** 2) for f in (f1, f2, 2800.0))
        shaped += spec * env / 3
    y = torch.fft.irfft(shaped, n)
    syll = 0.5 * (1 - torch.cos(2 * torch.pi * 3.0 * t)).clamp(min=0) ** 0.5  # ~3 syllables a second
    noise = torch.randn(n, generator=g, dtype=torch.float64) * ((t % 1.0) > 0.85)  # fricative-like bursts
    y = y * syll + 0.05 * noise
    return (0.5 * y / y.abs().max()).float()


def _stft_mag(x: torch.Tensor) -> torch.Tensor:  # [N] -> [frames, BINS]
    w = torch.hann_window(voc.N_FFT, periodic=True)
    return torch.fft.rfft(x.unfold(0, voc.N_FFT, voc.HOP) * w, dim=-1).abs()


def measure(sessions: int, iters: int, seconds: float, repeats: int) -> VocoderReport:
    dev = torch.device("cpu")
    fb = mel_filterbank(80, voc.N_FFT, voc.RATE, voc.RATE / 2)  # [mels, BINS]
    x = speech_like(seconds)
    # The flow head's target: normalised log-mel of 10 ms frames, 20 per micro-turn.
    pad = torch.cat([torch.zeros(voc.N_FFT // 2), x, torch.zeros(voc.N_FFT)])
    mel = _stft_mag(pad) @ fb.T  # [frames, mels]
    ticks = (mel.shape[0] - 1) // FRAMES_PER_TICK
    norm = (torch.log(mel.clamp(min=1e-5)) - voc.MEL_MEAN) / voc.MEL_STD
    v = voc.GriffinLim(80, iters, dev)
    mag, phase = v.initial_state(dev)
    mags = mag[None].expand(sessions, *mag.shape).contiguous()  # the state is opaque: any shape
    phases = phase[None].expand(sessions, *phase.shape).contiguous()
    out, times, cpu = [], [], []
    for n in range(ticks):
        chunk = norm[n * FRAMES_PER_TICK : (n + 1) * FRAMES_PER_TICK][None].repeat(sessions, 1, 1)
        t0, c0 = time.perf_counter(), time.process_time()
        y, mags, phases = v(chunk, mags, phases, True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        out.append(y[0])
    for _ in range(repeats):  # more timing samples on the last chunk (state keeps advancing: still realistic)
        t0, c0 = time.perf_counter(), time.process_time()
        v(chunk, mags, phases, True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    y = torch.cat(out)
    best = (float("inf"), 0.0, 0.0)
    for lag in range(-2 * voc.N_FFT, 2 * voc.N_FFT + 1, 24):  # the stream's delay is fixed; find it
        a, b = (y[lag:], x) if lag >= 0 else (y, x[-lag:])
        m = min(len(a), len(b)) - voc.N_FFT
        if m <= voc.N_FFT:
            continue
        ya, xa = _stft_mag(a[:m]), _stft_mag(b[:m])
        sc = float((ya - xa).norm() / xa.norm())
        if sc < best[0]:
            ym, xm = ya @ fb.T, xa @ fb.T
            msc = float((ym - xm).norm() / xm.norm())
            db = float((20 * (torch.log10(ym + 1e-5) - torch.log10(xm + 1e-5))).abs().mean())
            best = (sc, msc, db)
    return VocoderReport(
        iters,
        sessions,
        seconds,
        round(statistics.median(times) * 1000, 3),
        round(statistics.median(cpu) * 1000, 3),
        round(best[0], 4),
        round(best[1], 4),
        round(best[2], 2),
        torch.get_num_threads(),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.native.vocoder_quality", description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=16, help="rows per vocoder call (sessions in a step)")
    ap.add_argument("--iters", type=int, default=8, help="Griffin-Lim iterations (the tiny preset uses 8)")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of the test signal")
    ap.add_argument("--repeats", type=int, default=20, help="extra timed calls after the stream")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.sessions < 1 or args.iters < 0 or args.seconds < 1:
        ap.error("--sessions >= 1, --iters >= 0 and --seconds >= 1 are required")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"[bench.native.vocoder_quality] {args.seconds:.0f} s of test signal, {args.sessions} rows, "
          f"{args.iters} iterations", file=sys.stderr, flush=True)
    with torch.inference_mode():
        r = measure(args.sessions, args.iters, args.seconds, args.repeats)
    print(
        f"[bench.native.vocoder_quality] {r.ms_per_call:.2f} ms per call (CPU {r.cpu_ms_per_call:.2f} ms, "
        f"{r.ms_per_call / r.sessions:.3f} ms/session); "
        f"spectral convergence {r.spectral_convergence:.4f}, mel SC {r.mel_sc:.4f}, mel error {r.mel_db:.2f} dB",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
