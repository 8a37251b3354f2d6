"""The one exception type that means "the user's input is wrong" (exit code 2)."""


class InputError(Exception):
    """Bad input: the CLI prints the message on one line and exits with code 2."""
