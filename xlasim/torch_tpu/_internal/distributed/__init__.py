"""The simulated TorchTPU's ``torch.distributed`` backends."""
