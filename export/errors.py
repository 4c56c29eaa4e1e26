"""The exporter's error for a model source, below every module that raises it (sources.py and
pypi.py both do)."""


class SourceError(ValueError):
    """The model source is missing, unreadable, or cannot be fetched here."""
