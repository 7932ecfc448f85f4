"""``pipetrain.errors``: the one base class of the errors a user can fix.

Every layer's "bad input" exception (a model the front end refuses, settings out of range, data
of the wrong shape, a plan that does not fit a board, a missing tool, a link that cannot
connect) derives from :class:`UserError` as well as from its builtin kind (``ValueError``,
``RuntimeError``, …). The command line reports a :class:`UserError` as one line naming the
problem and the fix, with exit status 2, never a traceback; anything else is a bug
(docs/architecture.md §1).
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """An error in the user's input or environment; the message names the problem and the fix.

    Optional attribute ``rows``: ``{resource: {"needed", "available"}}`` for a fit error (the
    CLI's ``--json`` output carries it as ``"fit"``).
    """
