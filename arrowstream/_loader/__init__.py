"""The loader: torchdata's StatefulDataLoader wrapped, its state, checkpoints, batches, skips."""
