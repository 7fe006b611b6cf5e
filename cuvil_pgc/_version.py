"""The cuvil-pgc version (also in pyproject.toml): recorded in every trace and summary we write."""

__version__ = "0.1.0"
