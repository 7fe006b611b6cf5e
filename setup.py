"""Build hook for the optional C extensions; everything else is in pyproject.toml.

cuvil_pgc/instrument/_fastregion.c speeds up ProfileRegion's enter/exit and the trace writer's
event formatting; cuvil_pgc/recompile/_leancall.c a built region's call of its runtime, its checks
and its output's rebuild (see lean_call.py). Both are optional: where they cannot be compiled (no C compiler
or Python headers, free-threaded Python) the install still succeeds and their pure-Python versions run.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("cuvil_pgc.instrument._fastregion", ["cuvil_pgc/instrument/_fastregion.c"],
              extra_compile_args=["-O2", "-std=c11"], optional=True),
    Extension("cuvil_pgc.recompile._leancall", ["cuvil_pgc/recompile/_leancall.c"],
              extra_compile_args=["-O2", "-std=c11"], optional=True),
])
