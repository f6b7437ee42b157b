"""Builds the optional C kernels of the codec (wvc/codec/_native.c, and _step.c: ULP_STEP's
coder); everything else is in pyproject.toml. ``optional=True``: without a C compiler wvc installs and runs on its numpy
path, which computes the same bytes more slowly."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("wvc.codec._native", ["wvc/codec/_native.c"], optional=True,
                  extra_compile_args=["-O3", "-std=c99"], libraries=["m", "pthread"]),
        Extension("wvc.codec._step", ["wvc/codec/_step.c"], optional=True, extra_compile_args=["-O3", "-std=c99"]),
    ],
)
