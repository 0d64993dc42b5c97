"""Run at interpreter start (from ``xlasim.pth``) when ``XLASIM_TOPOLOGY`` is set."""

from xlasim._activation import activate_from_env

activate_from_env()
