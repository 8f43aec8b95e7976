"""Image files built to cost a reader memory or time: tiny files whose header declares a
huge image (PNG, GIF), and PNGs whose compressed metadata (zTXt, iCCP) inflates
far beyond Pillow's limits.  From the API (``coralrt.vision``) each is an
InputError at a small, bounded cost; ``coralrt run --image`` prints one error
line and exits 1, with no traceback.  A real image over the pixel limit is
refused before it is decoded, the limit can be raised, and the real test
images still decode under the default.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

from conftest import IMAGES_DIR, shared_image, shared_model
from coralrt._cli.main import main
from coralrt.errors import InputError
from coralrt.vision import as_rgb_array, classify

Image = pytest.importorskip("PIL.Image", reason="Pillow decodes images (the image extra)")

# Pillow warns of these sizes before coralrt refuses them: the warning is not the subject.
pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

V1 = "mobilenet_v1_0.25_128_quant.tflite"
SECONDS = 10.0      # far above what refusing any of these files takes (well under 1 s)


# -- crafted files ----------------------------------------------------------------------------

def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def png(width: int, height: int, *, extra: bytes = b"", idat: bytes | None = None) -> bytes:
    """An 8-bit RGB PNG; without ``idat``, pixel data for a tiny image only (for a huge
    declared size the file stays a few dozen bytes)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    if idat is None:
        idat = zlib.compress(b"\0" * (1 + 3 * min(width, 16)))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + extra + _chunk(b"IDAT", idat)
            + _chunk(b"IEND", b""))


def gif(width: int, height: int) -> bytes:
    """A GIF89a whose screen and one image declare ``width`` x ``height``."""
    screen = b"GIF89a" + struct.pack("<HH", width, height) + b"\x80\x00\x00"
    palette = b"\x00\x00\x00\xff\xff\xff"
    image = b"\x2c" + struct.pack("<HHHH", 0, 0, width, height) + b"\x00"
    return screen + palette + image + b"\x02\x02\x44\x01\x00" + b"\x3b"


def blank_png(width: int, height: int) -> bytes:
    """A valid black PNG, compressed row by row (never the whole image in memory)."""
    z = zlib.compressobj(1)
    row = b"\0" * (1 + 3 * width)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return png(width, height, idat=idat)


INFLATED = 64 << 20     # what the metadata bombs inflate to: 64 MiB (Pillow stops at 1 MiB)

BOMBS = {
    "png-100000x100000": lambda: png(100_000, 100_000),
    "gif-65535x65535": lambda: gif(65_535, 65_535),
    "png-12000x12000": lambda: png(12_000, 12_000),     # between Pillow's warning and refusal
    "png-zTXt": lambda: png(1, 1, extra=_chunk(
        b"zTXt", b"Comment\0\0" + zlib.compress(b"a" * INFLATED, 9))),
    "png-iCCP": lambda: png(1, 1, extra=_chunk(
        b"iCCP", b"icc\0\0" + zlib.compress(b"\0" * INFLATED, 9))),
}


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bombs")
    paths = {}
    for name, make in BOMBS.items():
        paths[name] = folder / f"{name}.{name.split('-')[0]}"
        paths[name].write_bytes(make())
    assert all(p.stat().st_size < 100_000 for p in paths.values())
    return paths


# -- the API --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(BOMBS))
def test_crafted_files_are_input_errors_at_a_bounded_cost(bombs, name):
    start = time.monotonic()
    with pytest.raises(InputError) as caught:
        as_rgb_array(bombs[name])
    assert time.monotonic() - start < SECONDS
    message = str(caught.value)
    assert str(bombs[name]) in message
    if "TXt" in name or "CCP" in name:
        assert "metadata" in message
    else:
        assert "declares" in message and "max_pixels" in message


def test_the_vision_helpers_refuse_them_too(bombs):
    from coralrt import InferenceSession
    sess = InferenceSession(shared_model(V1))
    for path in bombs.values():
        with pytest.raises(InputError):
            classify(sess, path)


def test_a_declared_size_over_the_limit_is_named(bombs):
    with pytest.raises(InputError, match=r"declares a 12000x12000 image \(144000000 pixels\), "
                                         r"more than the 89478485 pixels allowed by default"):
        as_rgb_array(bombs["png-12000x12000"])


def test_a_real_image_over_the_limit_is_refused_before_decoding(tmp_path):
    """A valid 12000 x 12000 PNG (432 MB decoded) under the default limit: refused
    while the process grows by far less than the decoded image would take."""
    path = tmp_path / "black.png"
    path.write_bytes(blank_png(12_000, 12_000))
    script = textwrap.dedent(f"""
        import resource
        from coralrt.errors import InputError
        from coralrt.vision import as_rgb_array
        import PIL.Image
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            as_rgb_array({str(path)!r})
            print("decoded")
        except InputError as e:
            print("refused", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    verdict, *grown = out.stdout.split()
    assert verdict == "refused"
    assert int(grown[0]) < 50 * 1024         # KiB: far below the 432 MB it would decode to


def test_the_limit_can_be_raised_and_is_checked(tmp_path):
    path = tmp_path / "black.png"
    path.write_bytes(blank_png(300, 200))
    with pytest.raises(InputError, match="300x200 image"):
        as_rgb_array(path, max_pixels=300 * 200 - 1)
    assert as_rgb_array(path, max_pixels=300 * 200).shape == (200, 300, 3)
    for bad in (0, -1, 1.5, True, "many"):
        with pytest.raises(InputError, match="max_pixels"):
            as_rgb_array(path, max_pixels=bad)


def test_pillows_own_refusal_is_an_input_error_naming_its_setting(bombs):
    with pytest.raises(InputError, match="PIL.Image.MAX_IMAGE_PIXELS"):
        as_rgb_array(bombs["png-100000x100000"], max_pixels=10**11)


def test_the_real_test_images_decode_under_the_default_limit():
    if not IMAGES_DIR.is_dir():
        pytest.skip(f"test images folder {IMAGES_DIR} is absent")
    images = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".bmp", ".jpg", ".png"))
    assert images
    for path in images:
        with Image.open(path) as im:
            want = np.asarray(im.convert("RGB"))
        assert np.array_equal(as_rgb_array(path), want), path.name


# -- coralrt run --image --------------------------------------------------------------------

def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", list(BOMBS))
def test_cli_prints_one_line_and_exits_1(bombs, capsys, name):
    code, out, err = run_cli(capsys, "run", shared_model(V1), "--image", bombs[name])
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("coralrt: error: "), err
    assert "Traceback" not in err and str(bombs[name]) in err


def test_cli_in_a_fresh_process_prints_no_traceback(bombs):
    out = subprocess.run([sys.executable, "-m", "coralrt", "run", str(shared_model(V1)),
                          "--image", str(bombs["png-100000x100000"])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_cli_max_image_pixels(capsys):
    image = shared_image("cat.bmp")                   # 512 x 341
    code, _, err = run_cli(capsys, "run", shared_model(V1), "--image", image,
                           "--max-image-pixels", 512 * 341 - 1)
    assert code == 1 and "512x341 image" in err and "--max-image-pixels" in err
    code, out, _ = run_cli(capsys, "run", shared_model(V1), "--image", image,
                           "--max-image-pixels", 512 * 341)
    assert code == 0 and "task     classify" in out
    code, _, err = run_cli(capsys, "run", shared_model(V1), "--image", image,
                           "--max-image-pixels", 0)
    assert code == 2 and "--max-image-pixels" in err
