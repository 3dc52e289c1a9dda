"""A real MCP server, written with the official SDK, whose tools runner's tests call through a scripted model.

python demo.py                 stdio
python demo.py --http PORT     streamable HTTP on 127.0.0.1:PORT/mcp
python demo.py --fail-start    writes a reason to stderr and exits 1 before it speaks MCP
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("demo", log_level="ERROR")
LONG_NAME = "a_tool_whose_name_is_far_too_long_for_any_provider_to_accept_it"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text as it was sent."""
    return text


@server.tool()
def env(variable: str) -> str:
    """The value of an environment variable of the server, or (unset)."""
    return os.environ.get(variable, "(unset)")


@server.tool()
def where() -> str:
    """The server's working directory."""
    return os.getcwd()


@server.tool()
def picture() -> Image:
    """A tiny PNG image."""
    return Image(data=b"\x89PNG\r\n\x1a\n" + bytes(24), format="png")


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ToolError("this tool always fails")


@server.tool()
def big(size: int) -> str:
    """A text of `size` characters."""
    return "x" * size


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after `seconds`."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def crash() -> str:
    """The server process dies without answering."""
    sys.stderr.write("demo server: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def spawn(seconds: str) -> str:
    """Start a grandchild that sleeps `seconds` (a number the caller can find it by) and leave it running."""
    subprocess.Popen(["sleep", seconds])
    return "started"


@server.tool()
def header(key: str, ctx: Context) -> str:
    """The value of an HTTP request header, or (none)."""
    return (ctx.headers or {}).get(key.lower(), "(none)")


@server.tool(name=LONG_NAME)
def long_named() -> str:
    """A tool whose SERVER__TOOL name is over 64 characters."""
    return "unreachable"


def main() -> None:
    if "--fail-start" in sys.argv:
        sys.stderr.write("demo server: missing configuration, giving up\n")
        sys.exit(1)
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()


if __name__ == "__main__":
    main()
