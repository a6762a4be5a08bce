"""A small ResNet-style CIFAR-shaped image classifier trained with DDP."""
