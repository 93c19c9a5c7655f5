"""OpenAI chat content parts with images: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`
parts become media markers in the message text (as llama-server turns them into mtmd markers before the chat
template runs) and their bytes are collected in order. Only data URLs are taken: nothing is fetched."""

from __future__ import annotations

import base64
import binascii
import mimetypes
from pathlib import Path

from pyggml.errors import ImageError
from pyggml.models.vision.prompt import MEDIA_MARKER

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # an encoded image larger than this is refused before decoding


def data_url_bytes(url) -> bytes:
    """The bytes of a base64 data URL; ImageError for a remote URL or a malformed or too large one."""
    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:60] if isinstance(url, str) else type(url).__name__
        raise ImageError(f"image_url must be a base64 data URL (data:image/...;base64,...); remote URLs are not "
                         f"fetched: {shown!r}")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        raise ImageError("image_url data URL must be base64-encoded (data:image/...;base64,...)")
    if len(payload) * 3 // 4 > MAX_IMAGE_BYTES:
        raise ImageError(f"image of about {len(payload) * 3 // 4} bytes is larger than the limit of "
                         f"{MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("image_url data URL is not valid base64") from None


def image_data_url(path) -> str:
    """An image file as a base64 data URL (what an image_url part carries); ImageError naming the file when it
    cannot be read or is over the limit. The type comes from the name; decoding looks at the bytes."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ImageError(f"{path}: cannot read the image: {e.strerror or e}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"{path}: {len(data)} bytes is larger than the limit of {MAX_IMAGE_BYTES} bytes")
    mime = mimetypes.guess_type(str(path))[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def has_image_parts(messages) -> bool:
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                          for p in m["content"])
               for m in messages if isinstance(m, dict))


def split_image_parts(messages: list[dict]) -> tuple[list[dict], list[bytes]]:
    """(messages whose image parts are text parts holding a media marker, the images' bytes in order)."""
    out, images = [], []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                image_url = part.get("image_url")
                url = image_url.get("url") if isinstance(image_url, dict) else image_url
                images.append(data_url_bytes(url))
                parts.append({"type": "text", "text": MEDIA_MARKER})
            else:
                parts.append(part)
        out.append({**m, "content": parts})
    return out, images
