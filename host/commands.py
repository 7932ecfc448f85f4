"""Registers every subcommand on :data:`pipetrain.host.cli.cli` (imported by ``main``)."""

from . import (
    cmd_build,  # noqa: F401
    cmd_compile,  # noqa: F401
    cmd_experiment,  # noqa: F401
    cmd_sim,  # noqa: F401
    cmd_train,  # noqa: F401
)
