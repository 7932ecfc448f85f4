"""The ``pipetrain`` command line: one command, one subcommand per job.

Every subcommand takes ``--json FILE`` (``-`` for stdout) and writes its machine-readable result
there. Errors in the user's input (model, data, settings, a net that does not fit a board) exit
with status 2 and one clear message on stderr, never a traceback; ``--json`` then gets
``{"error": message, "error_type": exception name}``, plus ``"fit"`` (``{resource: {needed,
available}}``) for a board fit error. A plan the HDL refuses while it is elaborated (a
``NotImplementedError``) is such an error too. A usage error (unknown option, bad value,
missing argument) is one line too when run through :func:`main` (the ``pipetrain`` console
script); so is an internal error. Amaranth's warnings about the HDL objects an error left
unelaborated are silenced, so the error stays the last line (:func:`quiet_unused_elaboratables`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from ...errors import UserError

#: The modules that define the subcommands (relative to this package).
COMMANDS = (".compile", ".train", ".build", ".experiment", ".sim")

__all__ = [
    "main",
    "cli",
    "json_option",
    "emit_json",
    "user_errors",
    "info",
    "quiet_unused_elaboratables",
]


def emit_json(target: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``target`` (a path, ``-`` for stdout, None for nowhere)."""
    if target is None:
        return
    text = json.dumps(payload, indent=2, sort_keys=False, default=str)
    if target == "-":
        click.echo(text)
    else:
        with open(target, "w") as f:
            f.write(text + "\n")


def json_option(func: Callable) -> Callable:
    """Add ``--json FILE`` to a subcommand (the result dict is passed as ``json_out``)."""
    return click.option(
        "--json",
        "json_out",
        type=str,
        default=None,
        metavar="FILE",
        help="Write machine-readable results to FILE ('-' for stdout).",
    )(func)


def quiet_unused_elaboratables() -> None:
    """Silence Amaranth's ``UnusedElaboratable`` warning for the rest of the process: after an
    error the HDL objects built before it are dropped unelaborated, and Amaranth would warn
    about each as it is freed — after the one-line error, burying it. Called on the CLI's error
    paths only (a successful run still warns about a real unused one)."""
    hdl = sys.modules.get("amaranth.hdl")
    if hdl is not None:
        warnings.filterwarnings("ignore", category=hdl.UnusedElaboratable)


def user_errors(func: Callable) -> Callable:
    """Turn a :class:`~pipetrain.errors.UserError` raised by ``func`` into a clean message and
    exit status 2; so too a ``NotImplementedError``, which the HDL raises for a plan it does not
    build (``Error: the HDL does not build this plan: …``)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (UserError, NotImplementedError) as exc:
            quiet_unused_elaboratables()
            message = str(exc)
            if not isinstance(exc, UserError):  # raised by the HDL's elaboration
                message = f"the HDL does not build this plan: {' '.join(message.split())}"
            payload: dict[str, Any] = {"error": message, "error_type": type(exc).__name__}
            if getattr(exc, "rows", None):
                payload["fit"] = exc.rows  # BoardFitError: needed vs available per resource
            try:
                emit_json(kwargs.get("json_out"), payload)
            except OSError as out_exc:  # the message below still reaches the user
                click.echo(f"Error: cannot write --json: {out_exc}", err=True)
            click.echo(f"Error: {message}", err=True)  # click's own prefix, for one style
            sys.exit(2)

    return wrapper


def info(message: str, json_out: str | None) -> None:
    """Print human-readable output; to stderr when JSON goes to stdout."""
    click.echo(message, err=(json_out == "-"))


class _CommandGroup(click.Group):
    """The group of :data:`COMMANDS`: their modules are imported (which registers their
    subcommands on :data:`cli`) the first time a command is listed or looked up."""

    def _load(self) -> None:
        for name in COMMANDS:
            importlib.import_module(name, __name__)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load()
        return super().get_command(ctx, cmd_name)


@click.group(cls=_CommandGroup)
@click.version_option(package_name="pipetrain")
def cli() -> None:
    """pipetrain: generate FPGA hardware that trains a PyTorch network on chip."""


#: click ≥ 8.2 raises this usage error to print a bare group's help (not an error to rewrite).
_NO_ARGS_IS_HELP: type[Exception] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("_Never", (Exception,), {})
)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: :data:`cli` on ``args`` (default ``sys.argv[1:]``), with a
    usage error (an unknown option, a bad value) printed as one line — ``Error: <click's
    message> (see 'pipetrain CMD --help')`` — instead of click's usage block, exit status 2.
    Any other exception is a pipetrain bug: one ``Internal error:`` line, exit status 1 (the
    traceback with ``PIPETRAIN_TRACEBACK=1``)."""
    try:
        rv = cli.main(args=args, prog_name="pipetrain", standalone_mode=False)
    except _NO_ARGS_IS_HELP as exc:  # a group called bare: click prints its help
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "pipetrain"
        message = " ".join(exc.format_message().split())
        click.echo(f"Error: {message} (see '{where} --help')", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("Aborted!", err=True)
        sys.exit(1)
    except Exception as exc:  # a bug of pipetrain's, not the user's: one line, unless asked
        if os.environ.get("PIPETRAIN_TRACEBACK"):
            raise
        quiet_unused_elaboratables()  # the error stays the last line
        click.echo(
            f"Internal error: {type(exc).__name__}: {' '.join(str(exc).split())} — this is a "
            "pipetrain bug; rerun with PIPETRAIN_TRACEBACK=1 for the traceback and report it",
            err=True,
        )
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
