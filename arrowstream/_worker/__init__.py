"""The worker runtime: readers, conversion, transport, shared memory, metrics, watchdog, leases."""
