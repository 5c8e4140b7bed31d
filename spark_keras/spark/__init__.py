"""Spark integration: BroadcastModel and its scoring helpers."""

from .broadcast import BroadcastModel

__all__ = ["BroadcastModel"]
