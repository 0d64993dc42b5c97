"""Simulated runtime state; the optional TPU-compiler layer (``libtpu_compiler``) lives here."""
