"""One argparse style for every command-line tool of the project.

Each CLI builds its parser with `make_parser(__name__-as-module, __doc__)`: the usage line reads
`python -m <module>` (how the tools are run), the module docstring is the description with its
line breaks kept (usage examples stay one per line), and every flag's help ends with its default.
"""

from __future__ import annotations

import argparse

# Exit code for "the input named on the command line is missing or unreadable": the same code
# argparse uses for usage errors, so scripts can tell bad invocations (2) from failed work (1).
EXIT_USAGE = 2


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's line breaks and appends `(default: X)` to each flag's help.

    No default is appended where it says nothing: None (the help says what unset means), on/off
    switches, or a help text that already describes its default.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if (
            action.default is None
            or action.default is argparse.SUPPRESS
            or isinstance(action.default, bool)
            or "default" in help_text.lower()
        ):
            return help_text
        return super()._get_help_string(action)


def make_parser(module: str, description: str | None, **kwargs: object) -> argparse.ArgumentParser:
    """An ArgumentParser for `python -m <module>` in the project's help style."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=description,
        formatter_class=HelpFormatter,
        **kwargs,  # type: ignore[arg-type]
    )
