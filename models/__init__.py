"""Everything that computes: the InteractionModel contract and its implementations."""
