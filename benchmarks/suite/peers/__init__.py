"""Adapter scripts, one per peer library, each run by the python of that peer's own venv."""
