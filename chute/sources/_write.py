"""The converters' common last step: samples in, a committed chute dataset out.

Every converter turns its source into ``(sample, origin)`` pairs, where ``origin``
says where the sample came from ("index row 12 (data/12.pkl.gz)", "tar
shard-3.tar, key 000041"). This module writes the samples with
:class:`chute.Writer`, counts them on the progress bar, and adds the origin to
schema errors, which otherwise name only a row position. Any exception (a bad
file, Ctrl-C) aborts the writer, so nothing valid is left at the destination.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import chute
from chute.errors import SchemaError
from chute.format.infer import InferenceError
from chute.format.writer import DEFAULT_LOOKAHEAD, DEFAULT_SHARD_SIZE
from chute.sources._progress import Progress
from chute.storage.open import open_dataset
from chute.storage.write import Writer

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from chute.storage.write import StoreOptions

__all__ = ["DEFAULT_SHARD_SIZE", "write_samples"]

_SAMPLE_POSITION = re.compile(r"\bsample (\d+)\b")


def write_samples(
    samples: Iterable[tuple[Mapping[str, Any], str]],
    dst: str | os.PathLike,
    *,
    progress: Progress,
    schema_hint: str | None = None,
    **options: Unpack[StoreOptions],
) -> chute.Dataset:
    """Write ``(sample, origin)`` pairs to a dataset at ``dst`` (a folder, or a URL as for
    ``chute.write``), commit it and open it.

    Without ``schema`` the writer infers the column types from the first samples.
    """
    # origins of the samples the writer may still complain about (its look-ahead window)
    recent: collections.deque[tuple[int, str]] = collections.deque(maxlen=DEFAULT_LOOKAHEAD + 1)
    writer = Writer(dst, **options)
    with progress:
        try:
            for position, (sample, origin) in enumerate(samples):
                recent.append((position, origin))
                writer.append(sample)
                progress.update()
            writer.close()
        except InferenceError as exc:  # keeps its fix: the converter says it in its caller's terms
            writer.abort()
            raise InferenceError(_with_origin(exc.detail, recent), exc.column, exc.position, exc.fix, exc.cast) from None
        except SchemaError as exc:
            writer.abort()
            message = _with_origin(str(exc), recent)
            raise SchemaError(f"{message}. With this converter, {schema_hint}" if schema_hint else message) from None
        except BaseException:
            writer.abort()
            raise
    return open_dataset(writer.url, storage_options=options.get("storage_options"))


def _with_origin(message: str, recent: collections.deque[tuple[int, str]]) -> str:
    """``message`` plus where the sample it names ("sample N, ...") came from, if known."""
    match = _SAMPLE_POSITION.search(message)
    origins = dict(recent)
    if match and int(match.group(1)) in origins:
        position = int(match.group(1))
        return f"{message} [sample {position} is {origins[position]}]"
    if recent:
        return f"{message} [while writing {recent[-1][1]}]"
    return message
