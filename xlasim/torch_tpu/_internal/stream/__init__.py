"""Streams and events of the ``tpu`` device."""
