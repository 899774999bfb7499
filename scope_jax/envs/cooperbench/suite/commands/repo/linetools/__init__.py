"""Text commands that turn a list of input lines into output lines."""

from linetools.commands import COMMANDS, command, run

__all__ = ("COMMANDS", "command", "run")
