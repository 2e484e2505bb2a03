"""The native extensions, compiled when chute is installed: chute._native (every C file in chute/_csrc)
and, where the system's libjpeg-turbo headers are present, chute._jpeg (partial and batch JPEG decoding).

Everything else about the package is in pyproject.toml; the extension is here
because setuptools' ``[tool.setuptools.ext-modules]`` table is still
experimental. A new kernel file in chute/_csrc is picked up by the glob: no list
to edit. ``-O3`` but no ``-march``: wheels must run on any x86-64 machine.

Not the stable ABI (``Py_LIMITED_API``): the kernels build strings in place
(``PyUnicode_New`` + ``PyUnicode_DATA``, outside the limited API in every
version) and take buffers with ``PyObject_GetBuffer``, limited only from 3.11,
while chute supports 3.10. One wheel per CPython version instead.
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "chute._native",
            sources=sorted(glob("chute/_csrc/*.c")),
            depends=sorted(glob("chute/_csrc/*.h")),
            extra_compile_args=["-O3", "-fvisibility=hidden"],
        ),
        # Partial JPEG decoding against the system's libjpeg-turbo (Debian/Ubuntu: libjpeg-turbo8-dev or
        # libjpeg62-turbo-dev), and the batch decode that writes each image with chute._native's crop and
        # resample kernels (kernels.c compiles planes.c and resample.c again, without their Python entry
        # points). Optional: without the headers the install goes on and chute.images decodes whole images
        # with simplejpeg.
        Extension(
            "chute._jpeg",
            sources=["chute/_jpegsrc/jpeg.c", "chute/_jpegsrc/kernels.c"],
            depends=["chute/_csrc/planes.c", "chute/_csrc/resample.c", "chute/_csrc/kernels.h", "chute/_csrc/native.h"],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-fvisibility=hidden"],
            optional=True,
        ),
    ]
)
