"""The one kind of error a user sees."""


class FeedbenchError(Exception):
    """A problem with the user's input or environment, told in one line.

    The CLI prints ``error: <message>`` on stderr and exits with status 2. Any other
    exception escaping to the CLI is a bug in feedbench.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class MissingDependency(FeedbenchError):
    """An optional dependency is needed for what was asked."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} is not installed: pip install 'feedbench[{extra}]'")
