"""The commands: each takes the input lines and returns the output lines, and is registered by name."""

COMMANDS = {}


def command(name: str):
    """Register the decorated function as the command `name`."""

    def register(function):
        COMMANDS[name] = function
        return function

    return register


def run(name: str, lines: list[str]) -> list[str]:
    """Run the command `name` on `lines`."""
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r}")
    return COMMANDS[name](list(lines))


@command("count")
def count(lines: list[str]) -> list[str]:
    """The number of lines."""
    return [str(len(lines))]


@command("upper")
def upper(lines: list[str]) -> list[str]:
    """Every line in upper case."""
    return [line.upper() for line in lines]
