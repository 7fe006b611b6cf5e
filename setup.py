"""Build hook for the one optional C extension; everything else is in pyproject.toml.

cuvil_pgc/instrument/_fastregion.c speeds up ProfileRegion's enter/exit and the trace writer's
event formatting. It is optional: where it cannot be compiled (no C compiler or Python headers,
free-threaded Python) the install still succeeds and regions run their pure-Python versions.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cuvil_pgc.instrument._fastregion", ["cuvil_pgc/instrument/_fastregion.c"],
                             extra_compile_args=["-O2", "-std=c11"], optional=True)])
