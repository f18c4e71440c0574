"""`python -m bench.vision` runs the per-frame cost bench (bench.vision.cost)."""

from bench.vision.cost import main

main()
