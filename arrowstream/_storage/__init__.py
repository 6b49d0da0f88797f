"""Storage: filesystems, retries, pinned versions, credentials, read-ahead."""
