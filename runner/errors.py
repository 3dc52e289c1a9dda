"""The exception tree of runner.

Limits, failed checks and provider failures end a run with an outcome, not an exception.
Exceptions are for crossing layers on purpose, and each carries a message a user can act on::

    RunnerError                 base; exit_code tells the CLI how to leave
    ├── ConfigError             a file or flag is invalid (exit 2); message is `file:line: field: expected`
    ├── ProviderError           the model endpoint cannot be used: no key, unknown model,
    │                           refused connection, failure after retries (exit 3)
    ├── StoreError              .runner/ cannot be read or written (exit 3)
    │   └── UnknownRun          no run has that id (exit 2)
    ├── DaemonError             the daemon cannot start or be reached (exit 3)
    ├── McpError                an MCP server cannot start, initialize or list its tools (exit 3)
    └── SandboxError            `sandbox: bwrap` is required but bubblewrap cannot run here (exit 3)
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error runner reports to the user."""

    exit_code = 3


class ConfigError(RunnerError):
    """Bad input: a goal, schedule or runner.yaml file, or a command-line flag."""

    exit_code = 2

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(dict.fromkeys(problems)) if problems else [message]  # a runner.yaml mistake once
        super().__init__("\n".join(self.problems) if problems else message)


class ProviderError(RunnerError):
    """The model provider cannot be used."""


class StoreError(RunnerError):
    """The run store is unusable."""


class UnknownRun(StoreError):
    """A run id given on the command line matches no run."""

    exit_code = 2


class DaemonError(RunnerError):
    """The daemon cannot start, or a command for it cannot be delivered."""


class McpError(RunnerError):
    """An MCP server a run needs cannot start, initialize or list its tools; names the server and why."""


class SandboxError(RunnerError):
    """A goal requires the bubblewrap jail (`sandbox: bwrap`) and it cannot run here; says why."""
