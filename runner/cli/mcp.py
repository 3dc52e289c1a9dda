"""`runner mcp`: serve runner over stdio as an MCP server; `runner mcp list [GOAL]`: the tools of the MCP servers."""

from __future__ import annotations

import click

from .common import project_of, reports_errors, run_async


@click.group(invoke_without_command=True)
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """Serve runner as an MCP server over stdio (list_goals, run_goal, get_run, list_runs, approve, reject,
    trigger).

    \b
    Example:
      claude mcp add runner -- runner mcp -C DIR
    """
    if ctx.invoked_subcommand is None:
        from ..mcp_server import serve

        serve(ctx.obj)


@mcp.command("list")
@click.argument("goal", required=False)
@click.pass_context
@reports_errors
def list_tools(ctx: click.Context, goal: str | None) -> None:
    """Start the MCP servers of GOAL (default: those of runner.yaml), print their tools, stop them.

    \b
    Example:
      runner mcp list triage
    """
    from ..config import load_goal
    from ..work.tools.mcp import survey
    from ..work.tools.sandbox import Jail

    project = project_of(ctx)
    if goal is None:
        servers, chosen, workdir, jail = project.settings.mcp, None, project.root, ()
    else:  # as a run of the goal starts them: its choice of tools, its workdir, its jail
        the_goal = load_goal(project, goal)
        chosen = None if the_goal.tools is None else [t.name for t in the_goal.tools]
        servers, workdir, jail = the_goal.mcp, the_goal.workpath, Jail.for_goal(the_goal).prefix
    if not servers:
        click.echo(f"no MCP servers in {goal or 'runner.yaml'}")
        return
    for connection, tools in run_async(survey(servers, chosen, workdir, jail)):
        click.echo(f"{connection.name} ({connection.where}): {len(tools)} tools")
        width = max((len(tool.name) for tool in tools), default=0)
        for tool in tools:
            summary = (tool.description.strip().splitlines() or [""])[0]
            click.echo(f"  {tool.name:<{width}}  {summary[:100]}")
        for problem in connection.left_out():
            click.echo(f"  left out: {problem}")


COMMANDS = [mcp]
