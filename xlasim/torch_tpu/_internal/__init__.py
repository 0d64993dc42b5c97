"""The simulated TorchTPU's modules behind its public ``torch.tpu`` names."""
