"""What the command line runs on top of the library: ``chute bench``/``tune`` (bench.py) and ``chute doctor`` (doctor.py).

These sit above the pipeline (a benchmark builds a Loader), so they are not
part of ``chute.observe``, which every layer may import.
"""
