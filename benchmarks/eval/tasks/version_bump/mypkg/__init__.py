"""mypkg: a small package."""

__version__ = "1.2.9"
