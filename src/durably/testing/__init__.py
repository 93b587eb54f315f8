"""Test kit for agents built on durably: real services that count side effects."""

from durably.testing.payments import FakePaymentsServer, refund

__all__ = ["FakePaymentsServer", "refund"]
