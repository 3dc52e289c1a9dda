"""The schedule loop (outer): the daemon, the triggers that fire entries, and the listeners for events.

`daemon.Daemon` is the embedded engine (APScheduler in one process, the SQLite store); a second
engine for a PostgreSQL store sits beside it.
"""
