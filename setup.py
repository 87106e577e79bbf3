"""Which packages the wheel ships, found rather than listed (metadata: pyproject.toml).

Every package under jgraph/ is found, so a new one cannot be left out of a user's
`pip install .`; the top-level kernels/ folder ships as jgraph.kernels, never as a bare
`kernels` (tests/test_package.py builds the wheel and checks both).
"""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["jgraph", "jgraph.*"]), "jgraph.kernels"],
      package_dir={"jgraph.kernels": "kernels"})
