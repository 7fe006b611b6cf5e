"""Fake GPU backends injected at the samplers' import seams (``_import_cupti`` / ``_import_nvml``).

They reuse the real modules' enums, constants, error classes and ctypes structures, and their
functions carry the real names and signatures (tests/test_sampler_cupti.py and
tests/test_sampler_nvml.py check that against the installed cupti-python and nvidia-ml-py).
Methods named ``sim_*`` are test controls with no counterpart in the real modules.
"""
