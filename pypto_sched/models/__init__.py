"""Model descriptions: the checkpoint reader and the tensor table both backends read."""
