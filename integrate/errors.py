"""The one exception type that means "the user's input is wrong" (exit code 2)."""


class InputError(Exception):
    """Bad input: the CLI prints the message on one line and exits with code 2. `details`: where the error has
    structure worth a program's reading (a missing package and the imports that lead to it), the JSON `--json`
    prints on stdout beside that line (docs/schema.md, "Errors"); None otherwise."""

    details: dict | None = None
