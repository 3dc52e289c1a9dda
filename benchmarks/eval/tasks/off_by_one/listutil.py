def last_n(items, n):
    """The last n items of a list."""
    return items[-n - 1:]
