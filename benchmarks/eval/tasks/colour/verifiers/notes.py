import sys

expected = """# Notes

The color of the sky is blue.
Pick a color for the button.
Each color has a name.
"""
if open("notes.md").read() != expected:
    sys.exit(1)
