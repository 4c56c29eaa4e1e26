"""Packaging: the three source folders are the `specrt` package. Subpackages are found, never
listed, so a new one needs no edit here (the metadata is pyproject.toml's)."""

from setuptools import find_packages, setup

ROOTS = {"specrt": "specrt", "specrt.export": "export", "specrt.runtime": "runtime"}

setup(
    package_dir=ROOTS,
    packages=[*ROOTS, *(f"{name}.{sub}" for name, folder in ROOTS.items()
                        for sub in find_packages(folder))],
)
