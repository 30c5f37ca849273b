"""Session-wide test set-up."""

# Python 3.11.7 can raise "SystemError: AST constructor recursion depth mismatch" when pytest's
# assertion rewriter parses a module late in a session (seen at the end of a run of a single
# test file, when hypothesis's plugin imports its observability module for the summary): the
# module is imported here, at start-up, instead.
import hypothesis.internal.observability  # noqa: F401
