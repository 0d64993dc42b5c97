"""The ``torch.tpu`` device module."""
