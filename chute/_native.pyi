"""chute's native kernels (C, chute/_csrc): batch gathers from memory-mapped shards.

Common arguments: ``indices`` is a C-contiguous int64 buffer of global row ids (any
order, duplicates allowed, possibly empty); ``offsets`` an int64 buffer of S + 1
entries, ``offsets[s]`` the first global row of shard s and ``offsets[S]`` the total
(``offsets[0] == 0``, non-decreasing); ``sources`` a list with one item per shard,
``None`` while the shard is not mapped.

Every function validates everything before it copies anything or returns a result:
``ValueError`` for bad arguments, ``IndexError`` for an index outside
``[0, offsets[S])``, :class:`Unmapped` when a shard the batch needs is ``None``,
:class:`CorruptShard` when a shard's buffers do not hold what its structure claims.
The buffers of every shard read are held for the whole call, so another thread may
replace list items meanwhile. Copies of 64 KiB and more run with the GIL released.
"""

import sys
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:  # anything with the buffer protocol (bytes, numpy arrays, mmap); no typing_extensions dependency
    Buffer: TypeAlias = Any

class Unmapped(LookupError):
    """A needed source is None; ``shard`` is the lowest such shard. Nothing was copied."""

    shard: int

class CorruptShard(ValueError):
    """A shard's buffers are inconsistent; ``row`` is the row within the shard, or -1."""

    shard: int
    row: int

SIMD: tuple[str, ...]
"""The instruction sets of the SIMD kernels compiled in, each used where the CPU has it: ``("ssse3",
"sse4.1", "avx2")`` on x86-64, ``()`` elsewhere or in a build with ``-DCHUTE_NO_SIMD``."""

BinarySource = tuple[Buffer, Buffer]
"""(value_offsets int64[rows + 1] counted in items, data)."""

MapSource = tuple[Buffer, Buffer, Buffer, Buffer | None, Buffer]
"""(entry_offsets int32[rows + 1], key_offsets int64[entries + 1], key_data,
value_offsets int64[entries + 1] or None for fixed-size values, value_data)."""

def gather(indices: Buffer, offsets: Buffer, columns: Sequence[tuple[Sequence[Buffer | None], Buffer, int]]) -> None:
    """Fixed-size rows: for each ``(sources, out, row_bytes)``, row i of ``out`` becomes row ``indices[i]``.

    ``sources[s]`` holds shard s's rows back to back; ``out`` is writable and holds
    exactly ``len(indices) * row_bytes`` bytes. One call serves every column of a batch.
    """

def gather_binary(
    indices: Buffer, offsets: Buffer, sources: Sequence[BinarySource | None], item_size: int = 1
) -> tuple[bytes, bytes]:
    """Rows of a large_binary / large_string / large_list column: ``(int64 offsets[n + 1] in items, values)``."""

def gather_map(
    indices: Buffer, offsets: Buffer, sources: Sequence[MapSource | None], value_size: int = 8
) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """Rows of a ``map<large_string, V>`` column, in Arrow's buffer layout.

    Returns ``(entry_offsets int32[n + 1], key_offsets int64[E + 1], key_data,
    value_offsets int64[E + 1] or b"" for fixed-size values, value_data)``, ready for
    ``pyarrow.Array.from_buffers``. Keys must be UTF-8.
    """

def join_json(offsets: Buffer, data: Buffer) -> bytes:
    """``b"[" + b",".join(rows) + b"]"`` of the rows ``data[offsets[i]:offsets[i + 1]]``."""

def take_objects(
    indices: Buffer, offsets: Buffer, sources: Sequence[BinarySource | None], kind: Literal["str", "bytes"]
) -> list[str] | list[bytes]:
    """The rows of a string/binary column as Python objects (``CorruptShard`` for invalid UTF-8)."""

def take_dicts(
    indices: Buffer,
    offsets: Buffer,
    sources: Sequence[MapSource | None],
    kind: Literal["str", "bytes", "int64", "float64"],
) -> list[dict[str, object]]:
    """One dict per row of a map column, keys in stored order (a repeated key: the last entry wins)."""

def dicts_from_values(entry_offsets: Buffer, key_offsets: Buffer, key_data: Buffer, values: list[object]) -> list[dict[str, object]]:
    """Dicts from ``gather_map``'s entry structure and one already decoded value per entry."""

def feistel(n: int, half: int, round_keys: Sequence[int], out: Buffer) -> None:
    """Fill the int64 buffer ``out`` (n items) with ``chute.order``'s Feistel permutation of ``range(n)``."""

def group_by_shard(rows: Buffer, width: int, offsets: Buffer, out: Buffer) -> None:
    """Each row of ``width`` int64 values of ``rows``, stably ordered by shard, into ``out`` (as many values, not
    overlapping ``rows``): the shard of a value is ``numpy.searchsorted(offsets, value, side="right")``."""

def thread_class(policy: int, slice_ns: int) -> bool:
    """Put the calling thread (Linux) in the fair class ``policy`` (0: SCHED_OTHER, 3: SCHED_BATCH) with a time slice
    of ``slice_ns`` (0: the kernel's default; honoured from Linux 6.12), keeping its nice value; False where that
    cannot be done (another platform, a sandbox, a thread that may not leave its class)."""

def planes(
    image: Buffer, height: int, width: int, x0: int, y0: int, out: Buffer, out_height: int, out_width: int, flip: bool = False
) -> None:
    """The ``out_height`` x ``out_width`` crop at ``(x0, y0)`` of an RGB image (uint8 ``[height, width, 3]``,
    C-contiguous) written into ``out`` as planes (uint8 ``[3, out_height, out_width]``), mirrored left-right
    with ``flip``. SSSE3 shuffles where the CPU has them (x86-64), a byte loop elsewhere."""

def resample(
    image: Buffer, height: int, width: int, box: Sequence[float], out: Buffer, out_height: int, out_width: int,
    flip: bool = False, lut: Buffer | None = None,
) -> None:
    """The ``box`` ``(x0, y0, x1, y1)`` (float pixels, taken in single precision) of an RGB image (uint8
    ``[height, width, 3]``, C-contiguous) resampled to ``out_height`` x ``out_width``: Pillow's bilinear
    arithmetic (triangle filter widened by the shrink factor, 22-bit fixed-point weights, a horizontal pass
    rounded to 8 bits over the rows the vertical pass reads, then the vertical pass). Mirrored left-right
    with ``flip``; written into ``out`` as planes: uint8 ``[3, out_height, out_width]``, or with ``lut``
    (``[3, 256]`` float32, or float16 bits as uint16) the table's value for each channel and level. The
    GIL is released for the whole call; ValueError for a box outside the image or buffers of the wrong
    size, before anything is written."""

def tokens_window(
    indices: Buffer, seq_len: int, starts: Buffer, sources: Sequence[tuple[Buffer, int] | None], itemsize: int,
    input_ids: Buffer, labels: Buffer,
) -> None:
    """``pack="concat"`` windows: window ``w`` is ``stream[w*L : w*L + L + 1]`` of the shards' tokens, widened to int64."""

def tokens_plan(doc_offsets: Buffer, seq_len: int, out: Buffer | None = None) -> int:
    """The number of sequences of next-fit packing of the documents; with ``out``: their boundaries."""

def tokens_packed(
    indices: Buffer, offsets: Buffer, sources: Sequence[tuple[Buffer, Buffer, Buffer] | None], itemsize: int,
    seq_len: int, pad_id: int, input_ids: Buffer, labels: Buffer, position_ids: Buffer, cu_seqlens: Buffer,
) -> int:
    """``pack="documents"`` rows, padded, with labels, position ids and cu_seqlens; the length of cu_seqlens."""

class GatherRing:
    """Gathers of fixed-size rows (as ``gather``) on native threads that never take the GIL (chute/_csrc/ring.c).

    ``submit`` checks a step as ``gather`` checks a call (IndexError, Unmapped, CorruptShard, ValueError)
    and queues it in place ``step % slots``; a thread copies its rows; ``wait`` returns the copy's
    ``(start_ns, end_ns, idle_ns)`` (CLOCK_MONOTONIC), None if the step was dropped, TimeoutError after
    ``timeout`` seconds (-1: for ever). ``drop`` ends a pass, ``close`` joins the threads."""

    threads: int
    slots: int

    def __init__(
        self, offsets: Buffer, sources: Sequence[Sequence[Buffer | None]], row_bytes: Sequence[int], slots: int,
        threads: int, policy: int = -1, slice_ns: int = 0,
    ) -> None: ...
    def submit(self, step: int, indices: Buffer, outs: Sequence[Buffer]) -> None: ...
    def wait(self, step: int, timeout: float) -> tuple[int, int, int] | None: ...
    def drop(self) -> None: ...
    def count_done(self, first: int, limit: int) -> int: ...
    def resize(self, threads: int) -> None: ...
    def close(self) -> None: ...
