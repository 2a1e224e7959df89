"""SolarWM: open data engine and scalable training for long-horizon video world models."""

__version__ = "0.1.0"
