"""The one kind of error a user sees, and the exit codes (docs/failures.md, "Exit codes")."""

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # a bad argument or unusable data: one `error:` line, nothing measured
EXIT_FAILED = 3  # a measurement failed (storage stalled or died, a rank died): results written
EXIT_NOT_WRITTEN = 4  # measured, but an output could not be written (a full disk): the rest kept
EXIT_INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP: partial results written


class FeedbenchError(Exception):
    """A problem with the user's input or environment, told in one line.

    The CLI prints ``details`` when set, then ``error: <message>`` on stderr, and exits with
    ``code`` (2 by default). Any
    other exception escaping to the CLI is a bug in feedbench.
    """

    code = EXIT_BAD_INPUT
    details: str | None = None  # shown before the error line (say, a traceback of user code)

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class MeasurementFailed(FeedbenchError):
    """The run was valid but a measurement could not be completed (exit 3)."""

    code = EXIT_FAILED


class NotWritten(FeedbenchError):
    """An output (results file, plot, page) could not be written: a full disk, a read-only
    folder (exit 4; what fitted is kept)."""

    code = EXIT_NOT_WRITTEN
