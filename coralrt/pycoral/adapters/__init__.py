"""pycoral.adapters on coralrt: reading and writing model tensors for common model kinds."""
