"""Program formats: what an Edge TPU step carries inside a ``.tflite``.

``opnames.py`` names the custom operators (one constant per name) and
holds the table of program formats (``FORMATS``: id, custom operator, magic,
compiler, handle class, output fix-ups) that every reader chooses by;
``segment.py``, ``memplan.py`` and ``segment_codec.py`` are coralrt's native
segment (data, on-chip memory plan, byte codec; docs/segment-format.md);
``dwn1.py`` (packages, choosing and checking executables), ``dwn1_executable.py``
(one executable), ``dwn1_layer.py`` (input/output layers, both the current and
the early table layout), ``dwn1_schema.py`` (field tables, enums kept as
numbers when unknown) and ``flexreader.py`` (the FlexBuffer wrapper of a
package) parse edgetpu_compiler's DWN1 packages; ``crc.py`` combines
CRC-32s of pieces (the compile cache checks segment CRCs with it).
"""
