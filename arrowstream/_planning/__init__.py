"""Planning: listing, footers, cutting into splits, the plan cache, the ranks' handshake."""
