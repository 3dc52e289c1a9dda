"""Configuration: the line-aware YAML loader, the pydantic models, project discovery and .env.

`models` says what the files may hold; `project` finds the project and loads goals; `schedules`
loads the schedule entries and the `Catalog` of everything a project declares.
"""

from __future__ import annotations

from .models import (
    ALWAYS_PROTECTED,
    BUILTIN_TOOLS,
    Budget,
    Check,
    DaemonSettings,
    Duration,
    Goal,
    Limits,
    ModelConfig,
    NotifyTarget,
    Price,
    SandboxSettings,
    Settings,
    Strict,
    StrList,
    ToolEntry,
    UiSettings,
    Verify,
    WebhookSettings,
    parse_duration,
)
from .project import Project, build_goal, find_root, goal_from_file, goal_path, load_dotenv, load_goal, load_project
from .schedules import TRIGGERS, Catalog, Entry, load_schedules

__all__ = [
    "ALWAYS_PROTECTED",
    "BUILTIN_TOOLS",
    "TRIGGERS",
    "Budget",
    "Catalog",
    "Check",
    "DaemonSettings",
    "Duration",
    "Entry",
    "Goal",
    "Limits",
    "ModelConfig",
    "NotifyTarget",
    "Price",
    "Project",
    "SandboxSettings",
    "Settings",
    "StrList",
    "Strict",
    "ToolEntry",
    "UiSettings",
    "Verify",
    "WebhookSettings",
    "build_goal",
    "find_root",
    "goal_from_file",
    "goal_path",
    "load_dotenv",
    "load_goal",
    "load_project",
    "load_schedules",
    "parse_duration",
]
