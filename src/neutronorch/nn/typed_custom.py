"""One's own module on a typed graph is adapted by ``nn/custom.py``'s ``UserModel`` (``TypedUserModel``), as
on a homogeneous one; this name stays for callers that import it from here."""

from neutronorch.nn.custom import TYPED_PROTOCOL, TypedUserModel

__all__ = ["TYPED_PROTOCOL", "TypedUserModel"]
