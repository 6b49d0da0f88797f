"""Mixtures: quotas, passes, every slot's parts of every source, batch shares (pure)."""
