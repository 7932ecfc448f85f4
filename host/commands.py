"""Registers every subcommand on :data:`pipetrain.host.cli.cli` (imported by ``main``)."""
