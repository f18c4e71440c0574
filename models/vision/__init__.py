"""What a session's camera shows, from models that ship inside PyPI wheels, on the CPU.

`detect.py` runs the detectors (mediapipe face mesh and hands, rapidocr) on one frame; `worker.py` runs
them in a separate process, so their GIL time and a crash stay out of the conversation; `tracker.py`
turns a session's observations over time into its visual state and cues. The rules are pure functions
on landmarks, testable without any model: `gestures.py` (a hand's gesture and finger count) and
`head.py` (facing, nod and shake from a head-pose track; a wave from a wrist track).
"""
