"""Images decoded straight into the batch: ``transform=chute.images.DecodeCrop("jpg", size=224, random=True)``.

A batch-level transform for :class:`chute.Loader` (docs/images.md): JPEG
decoded by simplejpeg (libjpeg-turbo, GIL released) into a reused per-thread
buffer, other formats by Pillow; the geometry (resize, crops, flips) planned for
the whole batch and applied with one copy or one resample per image, written
CHW into the batch's pooled block; random choices from ``(seed, epoch, row)``.
Every decode reads the image's header first and refuses one over ``max_pixels``
(default :data:`MAX_PIXELS`, Pillow's limit) before allocating anything of its size.
Needs the ``chute[images]`` extra (simplejpeg, Pillow), imported on first use.
"""

from chute.images.codec import MAX_PIXELS, ImageTooLargeError, MissingCodecError, decode_pillow, image_size
from chute.images.plan import CenterCrop, HorizontalFlip, Op, Plan, RandomCrop, RandomResizedCrop, Resize, dct_scale
from chute.images.render import IMAGENET_MEAN, IMAGENET_STD, Normalize
from chute.images.transform import Decode, DecodeCrop

__all__ = [
    "Decode",
    "DecodeCrop",
    "Resize",
    "CenterCrop",
    "RandomCrop",
    "RandomResizedCrop",
    "HorizontalFlip",
    "Normalize",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Op",
    "dct_scale",
    "Plan",
    "MissingCodecError",
    "ImageTooLargeError",
    "MAX_PIXELS",
    "decode_pillow",
    "image_size",
]
