"""The pure core: plan values, seeded order, cursors, shuffle windows, interleaving, a worker's stream."""
