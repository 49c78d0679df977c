"""Audio decoding (WAV, stdlib ``wave``) and log-mel features (numpy), Whisper-style.

Features: 16 kHz mono, 25 ms Hann window (n_fft 400), 10 ms hop, 80 Slaney mel bands, log10, clamped to
8 below the maximum and scaled to about [-1, 1].
"""

from __future__ import annotations

import functools
import io
import wave

import numpy as np

from dataplane.errors import InvalidInputError

SAMPLE_RATE = 16_000
N_FFT, HOP = 400, 160


def decode_wav(data: bytes, max_s: float | None = None) -> np.ndarray:
    """PCM WAV bytes -> float32 mono samples at 16 kHz in [-1, 1] (other rates are resampled linearly).

    ``max_s``: refuse audio longer than this many seconds, read from the header before any resampling."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            frames = w.readframes(n)
    except (wave.Error, EOFError, ValueError, RuntimeError) as exc:
        # wave raises a bare RuntimeError (no message) when a chunk's size runs past the end, and a bare EOFError
        # when the header is cut short: said in words
        why = str(exc) or {RuntimeError: "a chunk's size runs past the end of the file",
                           EOFError: "the file ends inside its header"}.get(type(exc), type(exc).__name__)
        raise InvalidInputError(f"audio is not a readable PCM WAV file ({why})") from None
    if width not in (1, 2, 4):
        raise InvalidInputError(f"unsupported WAV sample width {width} bytes; use 16-bit PCM")
    if rate <= 0 or channels <= 0:
        raise InvalidInputError(f"the WAV header gives {rate} samples/s and {channels} channels; both must be positive")
    # the frames present, not the header's count: a streamed WAV (ffmpeg writing to a pipe) says 0xFFFFFFFF
    n = min(n, len(frames) // (width * channels))
    frames = frames[: n * width * channels]  # (a streamed file may end inside a frame)
    if max_s is not None and n / rate > max_s:  # a low-rate file would first be stretched into a huge array
        raise InvalidInputError(f"audio is longer than {max_s:g} s")
    dtype = {1: np.uint8, 2: "<i2", 4: "<i4"}[width]
    x = np.frombuffer(frames, dtype=dtype).astype(np.float32)
    x = (x - 128.0) / 128.0 if width == 1 else x / float(2 ** (8 * width - 1))
    if channels > 1:
        x = x[: len(x) // channels * channels].reshape(-1, channels).mean(axis=1)
    if rate != SAMPLE_RATE and len(x):
        t_new = np.arange(int(len(x) * SAMPLE_RATE / rate)) / SAMPLE_RATE
        x = np.interp(t_new, np.arange(len(x)) / rate, x).astype(np.float32)
    if len(x) < N_FFT:
        raise InvalidInputError("audio is shorter than 25 ms")
    return x


def encode_wav(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """float samples in [-1, 1] -> 16-bit mono WAV bytes (for tests and examples)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


@functools.cache
def mel_filters(n_mels: int = 80, n_fft: int = N_FFT, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Slaney-style mel filterbank ``[n_mels, n_fft // 2 + 1]`` (area-normalised triangles)."""

    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        lin = f / (200.0 / 3)
        log = 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / (np.log(6.4) / 27.0)
        return np.where(f >= 1000.0, log, lin)

    def mel_to_hz(m):
        lin = m * (200.0 / 3)
        log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
        return np.where(m >= 15.0, log, lin)

    fft_freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    hz = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(rate / 2), n_mels + 2))
    lower = (fft_freqs[None, :] - hz[:-2, None]) / np.diff(hz)[:-1, None]
    upper = (hz[2:, None] - fft_freqs[None, :]) / np.diff(hz)[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (hz[2:] - hz[:-2]))[:, None]
    return weights.astype(np.float32)


def log_mel(samples: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """Log-mel spectrogram ``[n_mels, frames]`` with one frame per 10 ms."""
    pad = N_FFT // 2
    x = np.pad(samples.astype(np.float32), (pad, pad), mode="reflect")
    n_frames = 1 + (len(x) - N_FFT) // HOP
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n_frames)[:, None]
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)  # periodic Hann
    power = np.abs(np.fft.rfft(x[idx] * window, axis=1)) ** 2
    mel = mel_filters(n_mels) @ power[:-1].T if n_frames > 1 else mel_filters(n_mels) @ power.T
    logspec = np.log10(np.maximum(mel, 1e-10))
    logspec = np.maximum(logspec, logspec.max() - 8.0)
    return ((logspec + 4.0) / 4.0).astype(np.float32)
