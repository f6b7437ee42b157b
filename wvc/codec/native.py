"""The optional C kernels (``_native.c``), or None: the one switch every codec module reads.

None when the extension was not built (no C compiler at install) or when ``WVC_NO_NATIVE``
is set; the numpy path then writes the same bytes more slowly. Read ``native.kernels`` at
call time, so tests can switch paths by assigning it.

``whole_payloads``: the kernels also encode and decode whole payloads in one call
(``encode_payload``/``decode_payload``: one GIL release per chunk instead of several per
stream). They call zstd, and the zstd they call is python-zstandard's own: its wheels ship a
second build of the same bundled libzstd (the cffi backend, ``zstandard._cffi``) whose
functions are exported, and :func:`_zstd_functions` loads that file with ctypes and hands
the addresses over. The same library version as ``zstandard`` itself (checked), so payloads
are byte for byte those of the stream-by-stream path; nothing is compiled against zstd
headers and no second zstd is linked. False when that file is missing or of another
version: the stream-by-stream path is then used, with the same payloads.

``system_decoder``: the version of the system's libzstd when the kernels decompress with it
(:func:`_connect_system_decoder`), else None. python-zstandard's build has no assembly
Huffman loops; on x86-64 a distribution's libzstd 1.5.4 or later has, and the decode of
the many-tensor benchmark checkout's payloads took 0.93x the time with it (docs/design.md).
Only decompression moves: every conforming decoder yields the same bytes, and every chunk
is hash-checked after its decode anyway; compression stays python-zstandard's, so the
payloads written do not depend on what the system has. ``WVC_SYSTEM_ZSTD=0`` keeps the
bundled decoder.
"""

import logging
import os
import threading

from .. import settings

log = logging.getLogger(__name__)

try:
    from . import _native as kernels
except ImportError:
    kernels = None
if settings.switch("WVC_NO_NATIVE"):  # (at import: which kernels load, settings.py)
    kernels = None

# The zstd functions _native.c calls, in the order use_zstd takes them.
ZSTD_FUNCTIONS = (
    "ZSTD_versionNumber", "ZSTD_createCCtx", "ZSTD_CCtx_setParameter", "ZSTD_compress2", "ZSTD_compressBound",
    "ZSTD_isError", "ZSTD_createDCtx", "ZSTD_decompressDCtx", "ZSTD_getFrameContentSize", "ZSTD_freeCCtx",
    "ZSTD_freeDCtx",
)


def _cffi_path(zstandard) -> str | None:
    """python-zstandard's cffi backend, whose zstd symbols are exported; None without one."""
    from importlib.machinery import EXTENSION_SUFFIXES  # (importlib.util costs 3 ms to import)

    folder = os.path.dirname(zstandard.__file__)
    for suffix in EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_cffi" + suffix)
        if os.path.exists(path):
            return path
    return None


def _addresses(library: str, names) -> tuple[int, ...] | None:
    """The addresses of the functions ``names`` in the shared library ``library`` (a path or a
    soname), or None where it does not open or lacks one."""
    import ctypes

    try:
        lib = ctypes.CDLL(library)
        return tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in names)
    except (OSError, AttributeError, ValueError) as exc:
        log.debug("zstd functions not found in %s (%s)", library, exc)
        return None


def _zstd_functions(zstandard) -> tuple[int, ...] | None:
    """Addresses of python-zstandard's zstd functions, or None where they cannot be found."""
    path = _cffi_path(zstandard)
    return None if path is None else _addresses(path, ZSTD_FUNCTIONS)


def _connect_zstd() -> bool:
    if kernels is None or settings.switch("WVC_NO_WHOLE_PAYLOADS"):
        return False
    import zstandard

    import ctypes

    addresses = _zstd_functions(zstandard)
    if addresses is None or not all(addresses):
        return False
    major, minor, patch = zstandard.ZSTD_VERSION
    # another libzstd could compress differently: then the kernels get nothing and
    # zstandard's own calls stay
    if ctypes.CFUNCTYPE(ctypes.c_uint)(addresses[0])() != major * 10000 + minor * 100 + patch:
        return False
    kernels.use_zstd(addresses)
    return True


whole_payloads = _connect_zstd()


# The decompression functions use_zstd_decoder takes, in its order.
DECODER_FUNCTIONS = (
    "ZSTD_versionNumber", "ZSTD_isError", "ZSTD_createDCtx", "ZSTD_decompressDCtx", "ZSTD_getFrameContentSize",
    "ZSTD_freeDCtx",
)
SYSTEM_LIBZSTD = "libzstd.so.1"  # the soname: dlopen finds it without ldconfig or a compiler
# 1.5.4 (Debian 12's): the oldest measured. Assembly Huffman decoding came with 1.5.1;
# older system builds (Ubuntu 22.04 ships 1.4.8) are not faster than the bundled one.
MIN_SYSTEM_DECODER = 10504


def _connect_system_decoder() -> int | None:
    """Decompress with the system's libzstd where that is faster: x86-64, MIN_SYSTEM_DECODER
    or later (see the module's doc). Called once, at import, before any context exists."""
    machine = os.uname().machine if hasattr(os, "uname") else ""
    if not whole_payloads or not settings.switch("WVC_SYSTEM_ZSTD", True) or machine != "x86_64":
        return None
    import ctypes

    functions = _addresses(SYSTEM_LIBZSTD, DECODER_FUNCTIONS)
    if functions is None or not all(functions) or ctypes.CFUNCTYPE(ctypes.c_uint)(functions[0])() < MIN_SYSTEM_DECODER:
        return None
    version = kernels.use_zstd_decoder(functions)
    return version or None


system_decoder = _connect_system_decoder()


_retry_lock = threading.Lock()
_dropped = False  # the system's decoder was found wrong and is no longer used


def retry_with_bundled(decode):
    """``decode()`` once more with python-zstandard's decoder, after a chunk decoded with the
    system's failed its hash check (store.chains.decode_verified: every checked decode, from
    a pack or a remote); None where there is no other decoder, or where the chunk fails with
    the bundled one too (then it is damaged, and the system's decoder is put back).

    When the bundled decoder gets it right, the system's library is to blame: it is not used
    again in this process, and a warning says so once. (A repository must not read as corrupt
    because of a library wvc chose to use.) One retry at a time: threads that failed on the
    same library meanwhile only decode again."""
    global system_decoder, _dropped
    if system_decoder is None and not _dropped:
        return None
    from ..errors import CorruptObject

    with _retry_lock:
        if _dropped:  # (another thread found it wrong while this one decoded with it)
            try:
                return decode()
            except CorruptObject:
                return None
        kernels.decode_with_bundled(True)
        try:
            result = decode()
        except CorruptObject:
            kernels.decode_with_bundled(False)
            return None
        version, system_decoder, _dropped = system_decoder, None, True
    log.warning(
        "wvc: the system's libzstd (%s) decoded a chunk wrongly and python-zstandard's decoder "
        "did not; wvc decodes with the latter from now on (WVC_SYSTEM_ZSTD=0 skips the system's)",
        _version_text(version))
    return result


def _version_text(number: int) -> str:
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
