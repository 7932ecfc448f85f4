"""Shared pytest setup: ``--runslow`` enables tests marked ``slow`` (long RTL builds/sims);
tests marked ``icarus`` (the RTL in Icarus Verilog) are skipped, with the reason, when
``iverilog`` is not on PATH; the header and the summary print the seed of the random RTL
regression cases (``pipetrain.sim.tb.regress.regress_seed``: ``PIPETRAIN_REGRESS_SEED``, else
the commit), so every CI log says how to rerun them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

ICARUS_MISSING = (
    "Icarus Verilog is not installed (iverilog not on PATH): apt-get install iverilog "
    "(.ci/run installs it)"
)


def pytest_configure(config: pytest.Config) -> None:
    from pipetrain.sim.tb.regress import RegressSeedError, regress_seed

    try:
        regress_seed()
    except RegressSeedError as exc:
        raise pytest.UsageError(str(exc)) from None
    global _SEED_LINE
    _SEED_LINE = _seed_line()  # once: HEAD may move while a long run goes on
    config.addinivalue_line(
        "markers", "icarus: runs the RTL in Icarus Verilog (skipped when iverilog is missing)"
    )


def _seed_line() -> str:
    from pipetrain.sim.tb.regress import REGRESS_SEED_ENV, regress_seed

    seed, source = regress_seed()
    return (
        f"pipetrain RTL regression seed: {seed} (from {source}); rerun its random cases with "
        f"{REGRESS_SEED_ENV}={seed} pytest tests/test_rtl_regression.py"
    )


_SEED_LINE = ""


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The regression seed, and which pipetrain is under test: a ``pytest`` script of another
    interpreter (a pyenv shim, a venv without its own pytest) may import another checkout's
    code; ``python -m pytest`` (the README's command) tests the one installed for that
    Python."""
    import pipetrain

    here = Path(pipetrain.__file__).resolve().parent
    lines = [_SEED_LINE, f"pipetrain under test: {here}"]
    if here != Path(str(config.rootpath)).resolve():
        lines.append(
            f"WARNING: that is not this checkout ({config.rootpath}); run `python -m pytest` "
            "with the interpreter `pip install -e .` used"
        )
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(_SEED_LINE)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="also run tests marked slow (larger RTL regressions)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        no_icarus = pytest.mark.skip(reason=ICARUS_MISSING)
        for item in items:
            if item.get_closest_marker("icarus") is not None:
                item.add_marker(no_icarus)
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poisoned_collisions() -> Any:
    """Designs elaborated in the test read garbage where a weight bank's read meets a write to
    its address in the same cycle (``hdl.weights.poison_collisions``: the FPGA leaves that read
    undefined), so an RTL-vs-golden test passes only if no such read is used."""
    from pipetrain.hdl.weights import poison_collisions

    with poison_collisions():
        yield
