"""The epoch layout: what every (rank, worker) slot reads in an epoch, re-plans, even batches (pure)."""
