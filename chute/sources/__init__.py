"""Converters from other dataset layouts into chute's format (``chute convert``).

=====================  ==========================================================
module                 source
=====================  ==========================================================
``index``              a CSV/text index of per-sample files (pickle, JSON, npy,
                       images, raw bytes)
``images``             an image-classification folder (``root/<class>/<image>``)
``arrow``              Parquet / Arrow IPC / Feather files
``hf``                 a Hugging Face ``datasets.Dataset`` or ``save_to_disk`` dir
``npy``                NumPy ``.npy`` / ``.npz``
``webdataset``         WebDataset tar shards
``jsonl``              JSON lines files
``hdf5``               HDF5 / NetCDF4 files (``open_hdf5``: read in place)
``zarr``               Zarr groups (v2, v3), local or at a URL
``lmdb``               LMDB databases (a row per key)
``tfrecord``           TFRecord files of ``tf.train.Example``
``inplace``            arrays at file offsets as a dataset (the in-place view)
``detect``             which of these a path is
``dispatch``           ``convert``: detect, then run the right converter
``_files``             reading one file by extension (the pickle rule lives here)
``_arrow``             Arrow types -> chute columns, batch by batch
``_column_type``       a column type written as text (``--data-type``)
``_parallel``          reader processes with results in source order
``_write``             samples -> committed dataset, errors naming the source
``_dicts``             dict samples -> columns (the plan), ``cast=True``
``_hints``             errors that carry their fix (Python or CLI syntax)
``_remote``            sources at a URL (through chute.storage.net.remote)
``_progress``          the progress bar on stderr
``_arrays``            a tree of arrays -> columns (HDF5, Zarr)
``_blocks``            blocks of rows -> shards (the array and record sources)
``_example_pb``        ``tf.train.Example``'s protobuf messages
=====================  ==========================================================

Every converter reads its source in order, writes with :class:`chute.Writer`
from the main process, and leaves nothing valid at the destination if it fails.
"""

from chute.sources.arrow import from_arrow_files
from chute.sources.detect import KINDS, detect_kind
from chute.sources.dispatch import convert
from chute.sources.hdf5 import from_hdf5, open_hdf5
from chute.sources.hf import from_hf
from chute.sources.images import from_image_folder
from chute.sources.index import from_index
from chute.sources.inplace import InPlaceArrays
from chute.sources.jsonl import from_jsonl
from chute.sources.lmdb import from_lmdb
from chute.sources.npy import from_numpy
from chute.sources.tfrecord import from_tfrecord
from chute.sources.webdataset import from_webdataset
from chute.sources.zarr import from_zarr

__all__ = [
    "InPlaceArrays",
    "KINDS",
    "convert",
    "detect_kind",
    "from_arrow_files",
    "from_hdf5",
    "from_hf",
    "from_image_folder",
    "from_index",
    "from_jsonl",
    "from_lmdb",
    "from_numpy",
    "from_tfrecord",
    "from_webdataset",
    "from_zarr",
    "open_hdf5",
]
