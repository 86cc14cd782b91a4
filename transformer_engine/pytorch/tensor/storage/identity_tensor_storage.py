"""TE main's module path of IdentityTensorStorage (the storage classes are the tensor classes here)."""
from ..identity_tensor import IdentityTensor as IdentityTensorStorage

__all__ = ["IdentityTensorStorage"]
