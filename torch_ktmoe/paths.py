"""Paths handed to the native side: str, bytes or os.PathLike in, a UTF-8 str out, or an error naming the path."""
import os


def utf8_path(path, what: str) -> str:
    """``path`` (str, bytes or os.PathLike) as a str; ValueError naming ``what`` and the path's bytes when
    it is not valid UTF-8 (e.g. ``os.fsdecode(b"/x\\xff")``): the arena's C++ side and safetensors take
    UTF-8 paths only."""
    raw = os.fsencode(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {raw!r} is not a valid UTF-8 path (byte {raw[e.start]:#04x} at {e.start}); "
                         "torch_ktmoe's file-backed arena and safetensors take UTF-8 paths only: use a directory "
                         "whose path is UTF-8") from None
