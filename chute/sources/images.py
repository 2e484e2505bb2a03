"""Convert an image-classification folder (``root/<class name>/.../<image>``) into a chute dataset.

The layout torchvision's ``ImageFolder`` reads. Each image becomes one row:

* ``image``: the file's encoded bytes (JPEG, PNG, ...: not decoded, so nothing is
  lost and the dataset stays small; decode at load time);
* ``label``: the index of its class in the sorted class names (int64);
* ``path``: the file's path relative to ``root`` (``/``-separated).

With ``decode=True`` (``chute convert --decode``), ``image`` holds the decoded
pixels instead, ``uint8[3, height, width]`` (RGB, CHW, decoded as
``chute.images`` decodes: Pillow's pixels), so training skips decoding. Every
image must then have the same size. It costs ``3 * height * width`` bytes per
image against the encoded file's size: a 256 x 256 JPEG of ~25 KB becomes
196,608 bytes, about 8x; worth it for small images (CIFAR-like 32 x 32: 3 KB)
or when the decode is what holds training back and the disk or page cache has
the room (docs/images.md).

The class names are stored in the dataset's metadata (``ds.metadata["class_names"]``).
Rows are sorted by class, then by path, so converting twice gives the same dataset.
Files that are not images (by extension) are skipped and counted; hidden files and
directories (names starting with ``.``) are ignored. A class folder without images
is refused, as torchvision's ``ImageFolder`` does: it would still take a label and
shift the labels of every class after it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

import chute
from chute.errors import ChuteError
from chute.format.schema import Bytes, ColumnType, Scalar, String, Tensor
from chute.sources._files import IMAGE_EXTENSIONS
from chute.sources._parallel import OrderedPool, call_chunk, chunk_size_for, chunked
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

SCHEMA: dict[str, ColumnType] = {"image": Bytes(), "label": Scalar("int64"), "path": String()}


def list_images(root: str, extensions: frozenset[str] = IMAGE_EXTENSIONS) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """``(class names, [(relative path, label)], skipped relative paths)`` of an image folder."""
    classes = sorted(
        entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith(".")
    )
    images: list[tuple[str, int]] = []
    skipped = sorted(
        entry.name for entry in os.scandir(root) if entry.is_file() and not entry.name.startswith(".")
    )
    for label, name in enumerate(classes):
        for path in _walk_files(os.path.join(root, name)):
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if os.path.splitext(path)[1].lower() in extensions:
                images.append((relative, label))
            else:
                skipped.append(relative)
    return classes, images, skipped


def _walk_files(top: str) -> Iterator[str]:
    """Files under ``top`` in sorted order (directories and files sorted by name at each level)."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield os.path.join(dirpath, name)


def scan_image_folder(
    top: str, extensions: frozenset[str] | None = None
) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """:func:`list_images` of ``top``, refusing a missing folder, a folder without images and an
    empty class directory (it would shift every later label), each with a message naming it."""
    if not os.path.isdir(top):
        raise ChuteError(f"image folder {top} does not exist or is not a directory")
    exts = frozenset(e.lower() for e in extensions) if extensions is not None else IMAGE_EXTENSIONS
    classes, images, skipped = list_images(top, exts)
    if not images:
        raise ChuteError(
            f"found no images in {top}: expected {top}/<class name>/<image> with extensions "
            f"{' '.join(sorted(exts))} ({len(classes)} class director(ies), {len(skipped)} other file(s))"
        )
    _check_no_empty_class(top, classes, images, exts)
    return classes, images, skipped


def _check_no_empty_class(top: str, classes: list[str], images: list[tuple[str, int]], extensions: frozenset[str]) -> None:
    """Refuse class folders without images: each would take a label and shift the later ones."""
    labelled = {label for _, label in images}
    empty = [name for label, name in enumerate(classes) if label not in labelled]
    if empty:
        others = f" (and {len(empty) - 1} more: {', '.join(empty[1:4])}{', ...' if len(empty) > 4 else ''})" if len(empty) > 1 else ""
        raise ChuteError(
            f"class folder {os.path.join(top, empty[0])} holds no images ({' '.join(sorted(extensions))}){others}; "
            "every class folder becomes a label, so an empty one would shift the labels of the classes after it: "
            "remove it or add its images"
        )


def read_image_bytes(path: str) -> bytes:
    """The encoded bytes of one image file."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ChuteError(f"cannot read image {path} ({exc.strerror or exc}); fix or remove it and convert again") from None


def read_image_pixels(path: str) -> np.ndarray:
    """The decoded pixels of one image file, ``uint8[3, height, width]`` RGB (``--decode``)."""
    from chute.images.codec import Decoder, ImageTooLargeError

    data = read_image_bytes(path)
    try:
        return np.ascontiguousarray(Decoder().decode(data).transpose(2, 0, 1))
    except ImageTooLargeError as exc:
        raise ChuteError(f"cannot decode image {path}: {exc}; remove it, or convert without --decode") from None
    except ChuteError:
        raise
    except Exception as exc:
        raise ChuteError(f"cannot decode image {path} ({type(exc).__name__}: {exc}); fix or remove it and convert again") from None


def _decoded(samples: Iterator[tuple[dict, str]], bar: Progress) -> Iterator[tuple[dict, str]]:
    """Decoded samples, checked to be all of the first one's size; the size cost is said once."""
    shape = None
    for sample, origin in samples:
        pixels = sample["image"]
        if shape is None:
            shape = pixels.shape
            bar.note(
                f"--decode: {shape[1]} x {shape[2]} RGB images, stored as {pixels.nbytes:,} bytes each "
                "(the encoded files are typically 5-15x smaller)"
            )
        elif pixels.shape != shape:
            raise ChuteError(
                f"--decode needs every image to have the same size: {origin} is {pixels.shape[2]} x {pixels.shape[1]} "
                f"where the first image is {shape[2]} x {shape[1]}; resize the images first, or convert without --decode "
                "(and decode with chute.images at load time)"
            )
        yield sample, origin


def from_image_folder(
    root: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    extensions: frozenset[str] | None = None,
    workers: int | None = None,
    start_method: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
    decode: bool = False,
) -> chute.Dataset:
    """Convert ``root/<class name>/**/<image>`` to columns ``image`` (bytes), ``label``, ``path``.

    ``label`` indexes ``ds.metadata["class_names"]`` (the sorted class directory names).
    ``extensions`` (lower case, with the dot) replaces the default image extensions
    (.jpg .jpeg .png .webp .bmp .gif .tif .tiff). Files are read by ``workers`` processes.
    ``decode``: store decoded ``uint8[3, h, w]`` pixels instead of the files' bytes
    (all images the same size; see the module docstring for the size cost).
    """
    top = os.fspath(root)
    classes, images, skipped = scan_image_folder(top, extensions)
    bar = Progress(len(images), "chute convert (images)", enabled=progress, unit="images")
    if skipped:
        bar.note(f"skipping {len(skipped)} file(s) that are not images or not in a class directory, e.g. {skipped[0]}")
    paths = [os.path.join(top, relative) for relative, _ in images]
    with OrderedPool(workers, start_method=start_method) as pool:
        read = functools.partial(call_chunk, read_image_pixels if decode else read_image_bytes, {})
        contents = pool.map(read, chunked(paths, chunk_size_for(len(paths), pool.workers)))
        samples: Iterator[tuple[dict[str, Any], str]] = (
            ({"image": data, "label": label, "path": relative}, f"image {relative}")
            for (relative, label), data in zip(images, contents)
        )
        schema: dict[str, ColumnType] = SCHEMA
        if decode:
            samples = _decoded(samples, bar)
            first = read_image_pixels(paths[0])
            schema = {**SCHEMA, "image": Tensor("uint8", first.shape)}
        return write_samples(
            samples,
            dst,
            progress=bar,
            schema=schema,
            metadata={
                "class_names": classes,
                "source": {"kind": "images", "skipped_files": len(skipped), **({"decoded": True} if decode else {})},
            },
            shard_size=shard_size,
            overwrite=overwrite,
        )
