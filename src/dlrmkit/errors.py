"""User-facing errors: the CLI prints them as one line and exits with code 2, no traceback."""


class DlrmkitError(Exception):
    """A problem with the user's input (data, option, file) that they can fix.

    The message must say what is wrong and where (file, line, feature or option).
    """


class DatasetError(DlrmkitError):
    """A dataset whose files do not match its FeatureSpec, or hold invalid values."""
