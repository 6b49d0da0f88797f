"""What to install for an optional feature, said the same way in every error message.

arrowstream is not on a package index yet: asking pip for the extra by the project's name would find
nothing. A hint names the packages themselves (that works however arrowstream was installed) and the extra as
it is installed today, from a checkout or from a wheel built with `python -m build`
(docs/quickstart.md, "Install"). :data:`EXTRAS` mirrors pyproject.toml's optional dependencies
(tests/test_release.py holds them equal).
"""

from __future__ import annotations

EXTRAS: dict[str, tuple[str, ...]] = {
    "s3": ("s3fs>=2024.3",),
    "gcs": ("gcsfs>=2024.3",),
    "azure": ("adlfs>=2024.4",),
    "iceberg": ("pyiceberg[sql-sqlite]>=0.12,<0.13",),
    "accelerate": ("accelerate>=0.30",),
    "cli": ("tqdm>=4.60", "matplotlib>=3.8"),
}


def install_hint(extra: str) -> str:
    """How to install the ``extra``: its packages, or the extra from a checkout or a wheel.

    Example:
        >>> install_hint("s3")  # doctest: +ELLIPSIS
        'pip install "s3fs>=2024.3" (or the "s3" extra: pip install ".[s3]" in a checkout of arrowstream, ...'
    """
    from .. import __version__  # here, not at the top: modules the package imports eagerly may import this one

    packages = " ".join(f'"{package}"' for package in EXTRAS[extra])
    wheel = f"arrowstream-{__version__}-py3-none-any.whl"
    return (f'pip install {packages} (or the "{extra}" extra: pip install ".[{extra}]" in a checkout of arrowstream, '
            f'pip install "{wheel}[{extra}]" with its wheel)')
