"""Vision benches: perception's per-frame cost and how right it is, on real photos made into scenes and clips.

- `cost` (also `python -m bench.vision`): per-frame cost of each detector, held-out scenes, head motion.
- `clips`: head motion made from one real photo; `scenes`: a labelled, held-out picture set.
- `hands`: gestures and finger counts on real photos of hands.
- `reactions`: how soon the default voice reacts to what it sees while it speaks.
"""
