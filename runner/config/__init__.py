"""Configuration: the line-aware YAML loader, the pydantic models, project discovery and .env.

`models` says what the files may hold; `project` finds the project and loads goals; `schedules`
loads the schedule entries and the `Catalog` of everything a project declares; `values` checks
durations and the store without pydantic. Names load their module when first used: `runner runs`
reads runner.yaml's `store` without importing pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import loader

if TYPE_CHECKING:
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
    )
    from .project import Project, build_goal, find_root, goal_from_file, goal_path, load_dotenv, load_goal, load_project
    from .schedules import TRIGGERS, Catalog, Entry, load_schedules
    from .values import parse_duration

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

__getattr__ = loader(
    __name__,
    {
        "models": [
            "ALWAYS_PROTECTED",
            "BUILTIN_TOOLS",
            "Budget",
            "Check",
            "DaemonSettings",
            "Duration",
            "Goal",
            "Limits",
            "ModelConfig",
            "NotifyTarget",
            "Price",
            "SandboxSettings",
            "Settings",
            "Strict",
            "StrList",
            "ToolEntry",
            "UiSettings",
            "Verify",
            "WebhookSettings",
        ],
        "project": [
            "Project",
            "build_goal",
            "find_root",
            "goal_from_file",
            "goal_path",
            "load_dotenv",
            "load_goal",
            "load_project",
        ],
        "schedules": ["TRIGGERS", "Catalog", "Entry", "load_schedules"],
        "values": ["parse_duration"],
    },
)
