"""What a checkpoint holds: state models, migrations, and the checks of a loaded state (pure)."""
