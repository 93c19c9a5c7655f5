"""Images to the encoder's inputs as llama.cpp's mtmd-image.cpp makes them: decoded to RGB, resized with Pillow's
resampling (llama.cpp's img_tool reimplements it, fixed point included), cut into tiles per projector type, scaled
to [0, 1] and normalised with the file's mean and std.

- idefics3: resized (aspect kept) so the longer side is `clip.vision.preproc_image_size`, then stretched up to whole
  tiles of image_size, cut into a grid of tiles read row by row, plus the whole image at image_size (Lanczos);
  files without that key are sliced as llava-uhd slices (see idefics3_tiles).
- gemma3: one image_size square: resized with the aspect kept (bilinear) and centred on black.
- qwen2.5vl_merger: one image of its own aspect, its sides rounded to multiples of 2 x patch_size with the token
  count kept within clip.cpp's limits (transformers' smart_resize), resized (bicubic, aspect kept, centred on
  black).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml.errors import ImageError
from pyggml.models.vision.mmproj import QWEN25VL, QWEN_TOKENS_MAX, QWEN_TOKENS_MIN, VisionHParams

MAX_IMAGE_PIXELS = 32 * 1024 * 1024  # larger images are refused before they are decoded


@dataclass
class Tiles:
    """What one image becomes: normalised float32 [3, size, size] tiles, the grid they were cut from (columns, rows;
    (0, 0) for none; qwen2.5vl_merger: the columns and rows of its one image's embeddings) and the whole image's own
    tile (idefics3's global image; None for one-tile projectors)."""

    tiles: list
    grid: tuple = (0, 0)
    overview: np.ndarray | None = None


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ImageError("images need Pillow: pip install 'pyggml[vision]'") from None
    return Image


def read_image(source):
    """An image's encoded bytes (a path's are read), or the Pillow image it is."""
    if isinstance(source, (str, Path)):
        try:
            return Path(source).read_bytes()
        except OSError as e:
            raise ImageError(f"cannot read image {source}: {e.strerror}") from None
    return source if isinstance(source, _pillow().Image) else bytes(source)


def decode_image(source, max_pixels: int = MAX_IMAGE_PIXELS):
    """An RGB Pillow image from bytes, a path or a Pillow image; ImageError for data that is not an image or an image
    of more than max_pixels pixels."""
    image_mod = _pillow()
    data = read_image(source)
    if isinstance(data, image_mod.Image):
        image = data
    else:
        try:
            image = image_mod.open(io.BytesIO(data))
        except image_mod.DecompressionBombError as e:
            raise ImageError(f"image larger than the limit: {e}") from None
        except (OSError, ValueError):
            raise ImageError(f"not a decodable image ({len(data)} bytes in none of the formats Pillow reads)") from None
    if image.width * image.height > max_pixels:
        raise ImageError(f"image of {image.width}x{image.height} pixels is larger than the limit of {max_pixels} "
                         f"pixels")
    try:
        return image.convert("RGB")
    except (OSError, ValueError) as e:
        raise ImageError(f"image could not be decoded: {e}") from None


def normalise(image, h: VisionHParams) -> np.ndarray:
    """[3, height, width] float32 of (pixel / 255 - mean) / std per channel, in float32 as llama.cpp computes it."""
    rgb = np.asarray(image, dtype=np.uint8).astype(np.float32) / np.float32(255)
    mean, std = np.asarray(h.image_mean, np.float32), np.asarray(h.image_std, np.float32)
    return np.ascontiguousarray(((rgb - mean) / std).transpose(2, 0, 1))


def _resize(image, size: tuple, resample):
    return image if image.size == size else image.resize(size, resample)


def _fit(image, size: tuple, resample):
    """img_tool::resize with PAD_CEIL: scaled (aspect kept) to fit `size`, centred on black."""
    if image.size == size:
        return image
    w, h = np.float32(image.width), np.float32(image.height)
    scale = min(np.float32(size[0]) / w, np.float32(size[1]) / h)  # in float, as llama.cpp computes it
    new = (min(math.ceil(w * scale), size[0]), min(math.ceil(h * scale), size[1]))
    canvas = _pillow().new("RGB", size, (0, 0, 0))
    canvas.paste(image.resize(new, resample), ((size[0] - new[0]) // 2, (size[1] - new[1]) // 2))
    return canvas


def _tiles(refined, overview, tile: int, h: VisionHParams) -> Tiles:
    cols, rows = refined.width // tile, refined.height // tile
    tiles = [normalise(refined.crop((x * tile, y * tile, (x + 1) * tile, (y + 1) * tile)), h)
             for y in range(rows) for x in range(cols)]
    return Tiles(tiles, (cols, rows), normalise(overview, h))


def idefics3_tiles(image, h: VisionHParams) -> Tiles:
    """mtmd_image_preprocessor_idefics3: with `preproc_image_size` (the longest edge), resized (Lanczos) to it with
    the aspect kept, stretched up to whole tiles; without (older files), llava-uhd's slicing: the image fitted
    (bicubic, black padding) into whole tiles of its size rounded to tiles. The whole image too, at one tile."""
    image_mod, tile = _pillow(), h.image_size
    w, ht = image.size
    if h.longest_edge <= 0:
        refined = tuple(max(tile, math.floor(n / tile + 0.5) * tile) for n in (w, ht))
        return _tiles(_fit(image, refined, image_mod.BICUBIC), _resize(image, (tile, tile), image_mod.BICUBIC),
                      tile, h)
    aspect = w / ht
    if w >= ht:
        size = (h.longest_edge, int(h.longest_edge / aspect))
        size = (size[0], size[1] + size[1] % 2)
    else:
        size = (int(h.longest_edge * aspect), h.longest_edge)
        size = (size[0] + size[0] % 2, size[1])
    cols, rows = -(-size[0] // tile), -(-size[1] // tile)
    refined = _resize(_resize(image, size, image_mod.LANCZOS), (cols * tile, rows * tile), image_mod.LANCZOS)
    return _tiles(refined, _resize(refined, (tile, tile), image_mod.LANCZOS), tile, h)


def gemma3_tile(image, h: VisionHParams) -> Tiles:
    """mtmd_image_preprocessor_fixed_size with PAD_CEIL: the aspect kept (bilinear), centred on black."""
    return Tiles([normalise(_fit(image, (h.image_size, h.image_size), _pillow().BILINEAR), h)])


def smart_size(width: int, height: int, h: VisionHParams) -> tuple[int, int]:
    """clip.cpp's calc_size_preserved_ratio for Qwen-VL: each side rounded to a multiple of 2 x patch_size, then
    scaled (in float32, as llama.cpp) down to at most QWEN_TOKENS_MAX tokens or up to at least QWEN_TOKENS_MIN."""
    align = h.patch_size * h.scale_factor
    min_pixels, max_pixels = QWEN_TOKENS_MIN * align * align, QWEN_TOKENS_MAX * align * align
    f32, a = np.float32, np.float32(align)
    w_bar = max(align, math.floor(float(f32(width) / a) + 0.5) * align)  # std::round: halves away from zero
    h_bar = max(align, math.floor(float(f32(height) / a) + 0.5) * align)
    if w_bar * h_bar > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels))
        h_bar = max(align, int(np.floor(f32(height) / beta / a)) * align)
        w_bar = max(align, int(np.floor(f32(width) / beta / a)) * align)
    elif w_bar * h_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)))
        h_bar = int(np.ceil(f32(height) * beta / a)) * align
        w_bar = int(np.ceil(f32(width) * beta / a)) * align
    return w_bar, h_bar


def qwen25vl_image(image, h: VisionHParams) -> Tiles:
    """mtmd_image_preprocessor_dyn_size: the image at smart_size (bicubic, PAD_CEIL), one tile of its own size."""
    size = smart_size(image.width, image.height, h)
    block = h.patch_size * h.scale_factor
    return Tiles([normalise(_fit(image, size, _pillow().BICUBIC), h)], grid=(size[0] // block, size[1] // block))


def preprocess(image, h: VisionHParams) -> Tiles:
    if h.projector == QWEN25VL:
        return qwen25vl_image(image, h)
    return idefics3_tiles(image, h) if h.projector == "idefics3" else gemma3_tile(image, h)
