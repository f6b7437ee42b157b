"""JSON from an untrusted source, parsed only when it cannot build far more than its size.

``json.loads`` builds a Python object for every value: ``[{"":[]},{"":[]},...]`` is 4 bytes of
text a container, and each container costs ~100-200 bytes in memory, so a 65 MiB catalog
header of it took 2.36 GB (issue 49). The byte bound callers already check is therefore not a
memory bound. Here the text is first counted (a few passes of ``bytes.count``, C speed, no
allocation): values and keys (one per ``,`` or ``:``, plus one) and containers (``{`` and
``[``), and refused when it holds more than one value per MIN_BYTES_PER_VALUE bytes or one
container per MIN_BYTES_PER_CONTAINER bytes. Brackets and separators inside strings are
counted too, which only errs towards refusing, and wvc never writes such strings in these
records. What wvc writes is far above both (measured: 12-35 bytes a value, 138-195 a
container, in catalogs, pack indexes and step records). So the objects a parse can build
cost at most ~8 times the text (a 6-byte string value is ~60 bytes of str and list slot),
and that is the bound to state: peak ~ 9x the largest text a caller admits.
"""

from __future__ import annotations

import json

from ..errors import CorruptObject

MIN_BYTES_PER_VALUE = 8
MIN_BYTES_PER_CONTAINER = 24
SLACK = 64  # a tiny document may be all structure: {"a": [], "b": {}}
AMPLIFICATION = 9  # the stated bound: memory a parse may take, as a multiple of the text's size


def loads(data: bytes, where: str):
    """``json.loads(data)`` after the count above; CorruptObject naming ``where`` when the
    text is too dense in values or containers, or nested too deeply for the parser."""
    values = data.count(b",") + data.count(b":") + 1
    containers = data.count(b"{") + data.count(b"[")
    if values > len(data) // MIN_BYTES_PER_VALUE + SLACK or containers > len(data) // MIN_BYTES_PER_CONTAINER + SLACK:
        raise CorruptObject(f"{where} is malformed: {values} values and {containers} objects and lists in "
                            f"{len(data)} bytes, denser than any wvc writes (parsing it could take "
                            f"{AMPLIFICATION}x its size and more)")
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise CorruptObject(f"{where} is malformed (JSON nested too deeply)") from exc
