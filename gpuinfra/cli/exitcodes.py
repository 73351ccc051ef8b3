"""Exit codes shared by every verb."""

OK = 0
FAILED = 1
CHANGES_PENDING = 2  # only with --detailed-exitcode
INVALID_INPUT = 3
TIMEOUT = 4
CANCELLED = 130
OUTPUT_CLOSED = 141  # as a shell reports a tool that SIGPIPE ended
