"""Sources of rows: files under a path, Iceberg snapshots, a mixture's sources, planned to one Plan."""
