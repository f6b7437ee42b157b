"""The optional C kernels (``_native.c``), or None: the one switch every codec module reads.

None when the extension was not built (no C compiler at install) or when ``WVC_NO_NATIVE``
is set; the numpy path then writes the same bytes more slowly. Read ``native.kernels`` at
call time, so tests can switch paths by assigning it.
"""

import os

try:
    from . import _native as kernels
except ImportError:
    kernels = None
if os.environ.get("WVC_NO_NATIVE"):
    kernels = None
