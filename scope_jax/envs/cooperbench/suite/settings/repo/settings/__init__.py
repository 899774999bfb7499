"""Bulleted text lists, with settings that callers can override."""

from settings.defaults import DEFAULTS, resolve
from settings.render import render_list

__all__ = ("DEFAULTS", "render_list", "resolve")
