"""The package version, importable by every stage without importing the ``cuvil_pgc`` root package."""

__version__ = "0.1.0"
