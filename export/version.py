"""The exporter's version, written into every manifest it makes (`exporter_version`)."""

__version__ = "0.1.0"
